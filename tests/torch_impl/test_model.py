"""torch_impl's model: the behaviour both twins share (tests/twins/model.py), then torch specifics: the tied
head is one Parameter, loading casts, the twin's structure."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import spec
import torch_impl
from tests.backends import to_numpy
from tests.twins.model import ModelTwin
from torch_impl.layernorm import RMSNorm


class TestModelTwin(ModelTwin):
    backend = "torch"
    other_framework = ("jax", "jaxlib", "flax")

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None = None) -> Any:
        norm = RMSNorm(x.shape[-1], eps)
        with torch.no_grad():
            norm.weight.copy_(torch.as_tensor(weight))
            out = norm(torch.as_tensor(x)) if residual is None else norm(torch.as_tensor(x), torch.as_tensor(residual))
        return to_numpy(out) if residual is None else tuple(to_numpy(o) for o in out)


def test_tied_head_is_the_embedding_parameter(default_dir):
    model = torch_impl.from_pretrained(default_dir)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # named_parameters de-duplicates a shared Parameter
    assert sum(p.numel() for p in model.parameters()) == spec.parameter_count(model.spec)


def test_load_in_bfloat16_on_requested_dtype(default_dir):
    model = torch_impl.from_pretrained(default_dir, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # frequencies stay fp32
    with torch.inference_mode():
        assert model(torch.tensor([[1, 2, 3]])).dtype == torch.bfloat16
