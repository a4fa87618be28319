"""jax_impl.training: the training behaviour both twins share (tests/twins/training.py)."""

from __future__ import annotations

from tests.twins.training import TrainingTwin


class TestTrainingTwin(TrainingTwin):
    backend = "jax"
