"""Framework-neutral helpers for the backward tests: the term scales the "term_ulp" rows of
tests/kernels/tolerances.py are measured at, computed in float64 numpy from the test's inputs.

An element's term scale is the sum of the magnitudes of the terms the backward contract adds in float32 to
form it (kernels/triton/rms_norm_backward.py, swiglu_backward.py). Where the element is as large as its
terms the bound is in the element's own ulps; where the terms cancel, float32 noise and any skipped
intermediate rounding (a jitted JAX reference's excess precision) are measured against what they are
proportional to, the terms. Computed from the inputs, never from either result under test.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def as_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    """`a` rounded to `dtype` (nearest-even, as torch and XLA cast), returned as float64."""
    return np.asarray(a, np.float64).astype(_NUMPY_DTYPES[dtype]).astype(np.float64)


def add_rms_norm_term_scales(
    x: np.ndarray,
    residual: np.ndarray | None,
    weight: np.ndarray,
    d_out: np.ndarray,
    d_new_residual: np.ndarray | None,
    dtype: str,
    eps: float,
    offset: float = 0.0,
    float32_weight: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(scale of d_s = d_x = d_residual [..., H], scale of d_weight [H]) for float32 inputs cast to `dtype`.

    d_s = rstd * dy - s * rstd^3 * mean(dy * s) (+ g_s): terms rstd*|dy|, |s| * rstd^3 * mean|dy * s|, |g_s|.
    d_weight = sum over rows of D(g * n): terms |g * n|. With the family options (kernels/triton/
    rms_norm_backward.py): w is offset + w, and with float32_weight neither dy nor the products are rounded.
    """
    s, g, dy, x_hat = _rms_backward_terms(x, residual, weight, d_out, dtype, eps, offset, float32_weight)
    rstd = 1.0 / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + eps)  # [..., 1]
    scale_s = rstd * np.abs(dy) + np.abs(s) * rstd**3 * np.mean(np.abs(dy * s), axis=-1, keepdims=True)
    if d_new_residual is not None:
        scale_s = scale_s + np.abs(as_dtype(d_new_residual, dtype))
    n = x_hat if float32_weight else as_dtype(x_hat, dtype)
    scale_w = np.abs(g * n).reshape(-1, s.shape[-1]).sum(axis=0)  # [H]
    return scale_s, scale_w


def _rms_backward_terms(x, residual, weight, d_out, dtype, eps, offset, float32_weight):
    """(s, g, dy, x_hat) in float64 with the contract's roundings: dy = D(g * D(offset + w)), or g * (offset + w)
    unrounded with float32_weight; x_hat = s * rstd unrounded."""
    x, weight, g = as_dtype(x, dtype), as_dtype(weight, dtype), as_dtype(d_out, dtype)
    s = x if residual is None else as_dtype(x + as_dtype(residual, dtype), dtype)
    rstd = 1.0 / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + eps)  # [..., 1]
    w = offset + weight if float32_weight else as_dtype(offset + weight, dtype)
    dy = g * w if float32_weight else as_dtype(g * w, dtype)
    return s, g, dy, s * rstd


def silu_and_mul_term_scale(x: np.ndarray, d_out: np.ndarray, dtype: str) -> np.ndarray:
    """Scale of d_gate_up [..., 2I]: |g * up| * sig * (1 + |gate| * (1 - sig)) for gate, |g * silu(gate)| for up."""
    gate, up = np.split(as_dtype(x, dtype), 2, axis=-1)  # [..., I] each
    g = as_dtype(d_out, dtype)
    sig = 1.0 / (1.0 + np.exp(-gate))
    return np.concatenate([np.abs(g * up) * sig * (1.0 + np.abs(gate) * (1.0 - sig)), np.abs(g * gate * sig)], -1)


def add_rms_norm_contract_d_s(
    x: np.ndarray,
    residual: np.ndarray | None,
    weight: np.ndarray,
    d_out: np.ndarray,
    d_new_residual: np.ndarray | None,
    dtype: str,
    eps: float,
    offset: float = 0.0,
    float32_weight: bool = False,
) -> np.ndarray:
    """d_s = d_x = d_residual by the backward contract, in float64 with the contract's roundings to `dtype`:
    dy = D(g * w), d_s = D(rstd * (dy - s * rstd^2 * mean(dy * s))), then D(d_s + g_s) with a residual.
    Family options: w is D(offset + w); with float32_weight dy = g * (offset + w), unrounded."""
    s, _, dy, _ = _rms_backward_terms(x, residual, weight, d_out, dtype, eps, offset, float32_weight)
    rstd = 1.0 / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + eps)  # [..., 1]
    d_s = as_dtype(rstd * (dy - s * rstd**2 * np.mean(dy * s, axis=-1, keepdims=True)), dtype)
    return d_s if d_new_residual is None else as_dtype(d_s + as_dtype(d_new_residual, dtype), dtype)


def add_rms_norm_contract_d_weight(n: np.ndarray, d_out: np.ndarray, dtype: str) -> np.ndarray:
    """d_weight [H] by the backward contract from the normalized n (the forward's): D(sum over rows of D(g * n)),
    the products rounded to `dtype`, the sum exact (float64) and rounded once."""
    g = as_dtype(d_out, dtype)
    return as_dtype(as_dtype(g * n, dtype).reshape(-1, n.shape[-1]).sum(axis=0), dtype)


# GELU's tanh form, as the references compute it: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
_BETA, _KAPPA = np.sqrt(2.0 / np.pi), 0.044715


def gelu_tanh_and_mul_term_scale(x: np.ndarray, dtype: str) -> np.ndarray:
    """Scale of gelu_tanh_and_mul's output [..., I]: |0.5 * gate * up| * (1 + |tanh(u)|), the terms of the
    references' 1 + tanh(u), which cancel for u << 0 (kernels/triton/activations.py)."""
    gate, up = np.split(as_dtype(x, dtype), 2, axis=-1)  # [..., I] each
    t = np.tanh(_BETA * (gate + _KAPPA * gate**3))
    return np.abs(0.5 * gate * up) * (1.0 + np.abs(t))


def gelu_tanh_and_mul_grad_term_scale(x: np.ndarray, d_out: np.ndarray, dtype: str) -> np.ndarray:
    """Scale of d_gate_up [..., 2I] of gelu_tanh_and_mul: the magnitudes of the terms of torch's GeluBackward (and
    jax.grad's, the same), |g * up| * (0.5 (1 + |t|) + 0.5 |gate| (1 + t^2) beta (1 + 3 kappa gate^2)) for d_gate
    and |g| * |0.5 gate| * (1 + |t|) for d_up: 1 + t and 1 - t^2 cancel for u << 0."""
    gate, up = np.split(as_dtype(x, dtype), 2, axis=-1)  # [..., I] each
    g = as_dtype(d_out, dtype)
    t = np.tanh(_BETA * (gate + _KAPPA * gate**3))
    slope = 0.5 * np.abs(gate) * (1.0 + t * t) * _BETA * (1.0 + 3.0 * _KAPPA * gate * gate)
    d_gate = np.abs(g * up) * (0.5 * (1.0 + np.abs(t)) + slope)
    return np.concatenate([d_gate, np.abs(g * 0.5 * gate) * (1.0 + np.abs(t))], axis=-1)
