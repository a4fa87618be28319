"""torch_impl/optimizer.py on one process: weight decay goes to 2-D weights only, by the parameter table's kind, and
clip_grad_norm is torch's own (the tensor-parallel paths are tests/torch_impl/test_tensor_parallel.py's)."""

from __future__ import annotations

import dataclasses

import torch

import spec
import torch_impl
from spec.training import AdamW
from torch_impl.optimizer import clip_grad_norm, make_optimizer, runtime_names

QWEN2 = dataclasses.replace(
    spec.DEFAULT_SPEC, model_type="qwen2", attention_bias=True, qk_norm=False, tie_word_embeddings=False
)  # biases and an untied head: every kind of parameter


def test_decay_goes_to_two_dimensional_weights_only(tmp_path):
    path = spec.write_checkpoint(tmp_path, QWEN2, spec.random_weights(QWEN2, 2))
    model = torch_impl.from_pretrained(path)
    optimizer = make_optimizer(model, AdamW(weight_decay=0.05))
    decay, no_decay = optimizer.param_groups
    names = {id(p): name for name, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert any(names[id(p)].endswith("bias") for p in no_decay["params"])  # biases do not decay
    assert any("norm" in names[id(p)] for p in no_decay["params"])  # nor norm weights
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= {names[id(p)] for p in decay["params"]}
    assert len(decay["params"]) + len(no_decay["params"]) == len(runtime_names(model))


def test_clip_grad_norm_is_torchs_on_one_process(default_dir):
    model = torch_impl.from_pretrained(default_dir)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    expected = [p.grad.clone() for p in params]
    norm = clip_grad_norm(model, 1.0)
    assert torch.allclose(norm, torch.linalg.vector_norm(torch.stack([g.norm() for g in expected])), rtol=1e-6)
    scale = 1.0 / (float(norm) + 1e-6)
    for p, g in zip(params, expected, strict=True):
        assert torch.allclose(p.grad, g * scale, rtol=1e-6)
