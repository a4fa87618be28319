"""torch_impl.generate: the generation behaviour both twins share (tests/twins/generate.py)."""

from __future__ import annotations

from tests.twins.generate import GenerateTwin


class TestGenerateTwin(GenerateTwin):
    backend = "torch"
