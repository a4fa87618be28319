"""The whole model's parameter gradients with kernels="fused" (the backward kernels, interpreted on CPU) against
kernels="reference" (the reference's autograd / jax.grad), in float32, in both frameworks.

The built-in checkpoint (2 layers, hidden 64; interpreted kernels are slow) on a few tokens, a scalar loss
sum(logits * R) with fixed random R, and every parameter's gradient compared. Each is a sum over tokens of
products with activations, and the fused path differs from the reference only in float32 rounding and
reduction order (tests/kernels/test_backward_kernels.py bounds each kernel), so every gradient must be within
the kernel table's float32 d_weight row (tests/kernels/tolerances.py). The test also checks that the fused
backward kernels ran, so that a model quietly falling back to the reference cannot pass it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.backends import load, to_numpy
from tests.kernels.tolerances import assert_within_tolerance

IDS = np.array([[5, 9, 200, 17, 33, 101, 7], [1, 2, 3, 4, 5, 6, 7]])  # short: interpret mode is slow


def _loss_weights(vocab_size: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((*IDS.shape, vocab_size)).astype(np.float32)  # [B, T, V]


def torch_grads(directory: Path, kernels: str) -> tuple[float, dict[str, np.ndarray]]:
    import torch

    model = load("torch", directory, kernels=kernels)
    model.requires_grad_(True)  # the loader returns an inference model
    r = torch.from_numpy(_loss_weights(model.spec.vocab_size))
    loss = (model(IDS).float() * r).sum()
    loss.backward()
    return float(loss.detach()), {name: to_numpy(p.grad) for name, p in model.named_parameters()}


def jax_grads(directory: Path, kernels: str) -> tuple[float, dict[str, np.ndarray], str]:
    """(loss, gradients by parameter path, the gradient's jaxpr as text)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    model = load("jax", directory, kernels=kernels)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    r = jnp.asarray(_loss_weights(model.spec.vocab_size))

    def loss(params: nnx.State) -> jax.Array:
        return jnp.sum(nnx.merge(graphdef, params, rest)(IDS).astype(jnp.float32) * r)

    value, grads = jax.value_and_grad(loss)(params)
    jaxpr = str(jax.make_jaxpr(jax.grad(loss))(params))
    flat = {".".join(map(str, path)): to_numpy(leaf) for path, leaf in nnx.to_flat_state(grads)}
    return float(value), flat, jaxpr


def _compare(fused: dict[str, np.ndarray], reference: dict[str, np.ndarray], backend: str) -> float:
    assert fused.keys() == reference.keys() and len(fused) > 10
    worst = 0.0
    for name, want in reference.items():
        assert np.abs(want).max() > 0, f"{backend} {name}: the reference gradient is zero, the check would be empty"
        worst = max(worst, assert_within_tolerance(fused[name], want, "d_weight", "float32", f"{backend} {name}"))
    return worst


def test_torch_fused_gradients_match_reference(default_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    import kernels.triton.rms_norm as rms_norm
    import kernels.triton.swiglu as swiglu

    calls = {"rms_norm": 0, "swiglu": 0}
    for name, module in (("rms_norm", rms_norm), ("swiglu", swiglu)):
        launch = module.launch_backward

        def counted(*args, _launch=launch, _name=name, **kwargs):
            calls[_name] += 1
            return _launch(*args, **kwargs)

        monkeypatch.setattr(module, "launch_backward", counted)
    loss_ref, ref = torch_grads(default_dir, "reference")
    assert calls == {"rms_norm": 0, "swiglu": 0}
    loss_fused, fused = torch_grads(default_dir, "fused")
    # Per layer: the input norm, the post-attention norm, the q and k norms, one MLP; then the final norm.
    assert calls["rms_norm"] >= 4 * 2 + 1 and calls["swiglu"] == 2, calls
    assert abs(loss_fused - loss_ref) <= 1e-5 * abs(loss_ref)
    _compare(fused, ref, "torch")


def test_jax_fused_gradients_match_reference(default_dir: Path) -> None:
    pytest.importorskip("jax")
    loss_ref, ref, jaxpr_ref = jax_grads(default_dir, "reference")
    loss_fused, fused, jaxpr_fused = jax_grads(default_dir, "fused")
    for kernel in ("add_rms_norm_backward", "add_rms_norm_backward_sum_dw", "silu_and_mul_backward"):
        assert kernel in jaxpr_fused and kernel not in jaxpr_ref, kernel
    assert abs(loss_fused - loss_ref) <= 1e-5 * abs(loss_ref)
    _compare(fused, ref, "jax")
