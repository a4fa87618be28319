"""The decoder's norms with the fused add+norm contract: `__call__(x, residual=None)`.

Mirrors torch_impl/layernorm.py. RMSNorm(x) = (offset + g) * x / sqrt(mean(x^2) + eps): no mean subtraction, an
fp32 reduction, eps inside the square root; Gemma's norms scale by (1 + g) (offset 1.0) and, like OLMo 2's,
multiply by the weight in float32 before the one cast (float32_weight). LayerNorm (GPT-NeoX) subtracts the mean
and adds a bias. With a residual either returns (normed, new_residual) where new_residual = x + residual rounded to
the activation dtype (docs/design.md, "The dual-variable flow"). The RMSNorm math lives in
kernels/pallas/reference.py; `kernels="fused"` runs the Pallas kernel with the same contract. LayerNorm has no
kernel: both paths run the reference math below.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
from flax import nnx

from kernels.pallas import reference
from spec import ModelSpec


class RMSNorm(nnx.Module):
    def __init__(
        self,
        dim: int,
        eps: float,
        *,
        dtype: jnp.dtype,
        offset: float = 0.0,
        float32_weight: bool = False,
        kernels: str = "reference",
    ):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))  # [dim]
        self.eps = eps
        self.offset = offset  # Gemma: the weight is stored as g - 1 and applied as (1 + g)
        self.float32_weight = float32_weight
        self.kernels = kernels

    def __call__(self, x: jax.Array, residual: jax.Array | None = None) -> jax.Array | tuple[jax.Array, jax.Array]:
        # The family options are passed only when set, so the Llama/Qwen call is the one it always was.
        options = {}
        if self.offset or self.float32_weight:
            options = dict(offset=self.offset, float32_weight=self.float32_weight)
        if self.kernels == "fused":
            from kernels.pallas import add_rms_norm  # imports pallas: only on the fused path

            if options and "offset" not in inspect.signature(add_rms_norm).parameters:
                raise NotImplementedError(
                    "kernels='fused': the Pallas add_rms_norm has no offset/float32_weight options yet (Gemma, "
                    "OLMo 2 norms); use kernels='reference'"
                )
            return add_rms_norm(x, residual, self.weight[...], self.eps, **options)
        return reference.add_rms_norm_reference(x, residual, self.weight[...], self.eps, **options)


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """torch.nn.LayerNorm's math: fp32 mean and (biased) variance, (x - mean) * rsqrt(var + eps) * w + b in fp32,
    one cast to the activation dtype."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)  # [..., 1]
    centred = xf - mean
    variance = jnp.mean(jnp.square(centred), axis=-1, keepdims=True)  # [..., 1]
    out = centred * jax.lax.rsqrt(variance + eps) * weight.astype(jnp.float32) + bias.astype(jnp.float32)
    return out.astype(x.dtype)


class LayerNorm(nnx.Module):
    """LayerNorm with weight and bias (GPT-NeoX), the same (x, residual=None) contract as RMSNorm."""

    def __init__(self, dim: int, eps: float, *, dtype: jnp.dtype, kernels: str = "reference"):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))  # [dim]
        self.bias = nnx.Param(jnp.zeros((dim,), dtype))  # [dim]
        self.eps = eps
        self.kernels = kernels  # no LayerNorm kernel: "fused" runs the same reference math

    def __call__(self, x: jax.Array, residual: jax.Array | None = None) -> jax.Array | tuple[jax.Array, jax.Array]:
        if residual is None:
            return layer_norm(x, self.weight[...], self.bias[...], self.eps)
        # The new residual rounded to the activation dtype, as the unfused model stores x1 / x2.
        s = (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
        return layer_norm(s, self.weight[...], self.bias[...], self.eps), s


def make_norm(spec: ModelSpec, dim: int, *, dtype: jnp.dtype, kernels: str = "reference") -> RMSNorm | LayerNorm:
    """The spec's norm over `dim` features (every norm of a layer, the final norm and the q/k norms)."""
    if spec.norm_type == "layer":
        return LayerNorm(dim, spec.rms_norm_eps, dtype=dtype, kernels=kernels)
    return RMSNorm(
        dim,
        spec.rms_norm_eps,
        dtype=dtype,
        offset=spec.norm_offset,
        float32_weight=spec.norm_weight_float32,
        kernels=kernels,
    )
