"""jax_impl/optimizer.py: the AdamW transform steps as torch.optim.AdamW(fused=True) does, in float32 and bfloat16,
and the clipping follows torch's formula. torch's own optimizer is the reference, on the same values."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from jax_impl.optimizer import torch_adamw, torch_like_clip
from spec.training import AdamW

CONFIG = AdamW(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
SHAPE = (203, 97)  # neither a power of two


def _values(seed: int, steps: int) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    start = (rng.standard_normal(SHAPE) * 0.02).astype(np.float32)
    grads = [(rng.standard_normal(SHAPE) * 10.0 ** rng.uniform(-5, -1, SHAPE)).astype(np.float32) for _ in range(steps)]
    return start, grads


def _torch_steps(start, grads, dtype: torch.dtype, decay: bool) -> np.ndarray:
    p = torch.tensor(start).to(dtype).requires_grad_(True)
    wd = CONFIG.weight_decay if decay else 0.0
    opt = torch.optim.AdamW(
        [p], lr=CONFIG.lr, betas=(CONFIG.beta1, CONFIG.beta2), eps=CONFIG.eps, weight_decay=wd, fused=True
    )
    for g in grads:
        p.grad = torch.tensor(g).to(dtype)
        opt.step()
    return p.detach().float().numpy()


def _jax_steps(start, grads, dtype, transform: optax.GradientTransformation) -> np.ndarray:
    params = {"w": jnp.asarray(start).astype(dtype)}
    state = transform.init(params)
    for g in grads:
        updates, state = transform.update({"w": jnp.asarray(g).astype(dtype)}, state, params)
        params = optax.apply_updates(params, updates)
    assert params["w"].dtype == dtype  # the parameter keeps its dtype
    return np.asarray(params["w"].astype(jnp.float32))


@pytest.mark.parametrize("decay", [True, False])
def test_float32_steps_equal_torch_fused_adamw(decay):
    start, grads = _values(0, 4)
    """Within one ulp of the parameter plus 1e-5 * lr over 4 steps (measured: 3.7e-6 * lr, float32 operations in
    another order). optax.adamw is the control: its bias correction 1 - b2 ** t in float32 loses four digits to
    cancellation, 3e-5 * lr here."""
    torch_result = _torch_steps(start, grads, torch.float32, decay)
    allowed = np.spacing(np.maximum(np.abs(start), np.abs(torch_result))) + 1e-5 * CONFIG.lr
    ours = _jax_steps(start, grads, jnp.float32, torch_adamw(CONFIG, lambda p: {"w": decay}))
    assert (np.abs(ours - torch_result) <= allowed).all(), np.abs(ours - torch_result).max()
    wd = CONFIG.weight_decay if decay else 0.0
    plain = optax.adamw(CONFIG.lr, CONFIG.beta1, CONFIG.beta2, CONFIG.eps, weight_decay=wd)
    control = _jax_steps(start, grads, jnp.float32, plain)
    assert not (np.abs(control - torch_result) <= allowed).all()


@pytest.mark.parametrize("decay", [True, False])
def test_bfloat16_steps_round_as_torch_fused_adamw(decay):
    """bf16 storage: the step in float32, the parameter and moments rounded once when stored. optax.adamw
    (every intermediate in bf16) is the control: it lands a bf16 ulp away in a few percent of the elements."""
    start, grads = _values(1, 3)
    torch_result = _torch_steps(start, grads, torch.bfloat16, decay)
    ours = _jax_steps(start, grads, jnp.bfloat16, torch_adamw(CONFIG, lambda p: {"w": decay}))
    wd = CONFIG.weight_decay if decay else 0.0
    plain = optax.adamw(CONFIG.lr, CONFIG.beta1, CONFIG.beta2, CONFIG.eps, weight_decay=wd)
    control = _jax_steps(start, grads, jnp.bfloat16, plain)
    assert np.mean(ours != torch_result) <= 1e-3, np.mean(ours != torch_result)
    assert np.mean(control != torch_result) >= 1e-2  # the test can tell the two arithmetics apart


def test_clip_is_torchs_formula():
    """scale = max_norm / (norm + 1e-6) when below 1, as torch.nn.utils.clip_grad_norm_; untouched above."""
    g = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([[12.0]])}  # norm 13
    clipped, _ = torch_like_clip(1.0).update(g, None)
    scale = 1.0 / (13.0 + 1e-6)
    np.testing.assert_allclose(np.asarray(clipped["a"]), [3 * scale, 4 * scale], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(clipped["b"]), [[12 * scale]], rtol=1e-6)
    kept, _ = torch_like_clip(100.0).update(g, None)
    np.testing.assert_array_equal(np.asarray(kept["a"]), [3.0, 4.0])
    ta, tb = torch.tensor([3.0, 4.0]), torch.tensor([[12.0]])
    ta.grad, tb.grad = ta.clone(), tb.clone()
    torch.nn.utils.clip_grad_norm_([ta, tb], 1.0)
    np.testing.assert_allclose(np.asarray(clipped["a"]), ta.grad.numpy(), rtol=1e-6)
