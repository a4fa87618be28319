"""RMSNorm with the fused add+RMSNorm contract: `__call__(x, residual=None)`.

Mirrors torch_impl/layernorm.py. RMSNorm(x) = g * x / sqrt(mean(x^2) + eps): no mean subtraction, an fp32
reduction, eps inside the square root. With a residual it returns (normed, new_residual) where
new_residual = x + residual rounded to the activation dtype (docs/design.md, "The dual-variable flow"). The math
lives in kernels/pallas/reference.py; `kernels="fused"` runs the Pallas kernel with the same contract.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels.pallas import reference


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, dtype: jnp.dtype, kernels: str = "reference"):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))  # [dim]
        self.eps = eps
        self.kernels = kernels

    def __call__(self, x: jax.Array, residual: jax.Array | None = None) -> jax.Array | tuple[jax.Array, jax.Array]:
        if self.kernels == "fused":
            from kernels.pallas import add_rms_norm  # imports pallas: only on the fused path

            return add_rms_norm(x, residual, self.weight[...], self.eps)
        return reference.add_rms_norm_reference(x, residual, self.weight[...], self.eps)
