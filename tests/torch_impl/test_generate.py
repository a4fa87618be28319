"""torch_impl.generate: the generation behaviour both twins share (tests/twins/generate.py), and its sampler at the
smallest temperature allowed."""

from __future__ import annotations

import torch

from spec.generation import MIN_TEMPERATURE, SamplingParams
from tests.twins.generate import GenerateTwin
from torch_impl.generate import sample


class TestGenerateTwin(GenerateTwin):
    backend = "torch"


def test_the_smallest_temperature_samples_each_rows_maximum():
    """30 / MIN_TEMPERATURE overflows float32: unshifted, two logits of a row become inf and their softmax NaN."""
    logits = torch.tensor([[29.0, 1.0, 30.0], [39.5, -5.0, 40.0]])
    tokens = sample(logits, SamplingParams(temperature=MIN_TEMPERATURE), torch.Generator().manual_seed(0))
    assert tokens.tolist() == [2, 2]  # unshifted, the first inf would win a tie
