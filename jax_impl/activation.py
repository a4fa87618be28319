"""The MLP's activations: gated on a merged [..., 2I] input, gate first (SwiGLU, GeGLU), or plain (`activation`).

Mirrors torch_impl/activation.py. The gated math lives in kernels/pallas/reference.py (fp32, cast once);
`kernels="fused"` runs the Pallas kernel with the same contract. `activation(name, x)` is the non-gated MLP's
(GPT-NeoX): computed in float32 and cast once, as torch's activations do on a low-precision input.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from kernels.pallas import reference


class SiluAndMul(nnx.Module):
    def __init__(self, *, kernels: str = "reference"):
        self.kernels = kernels

    def __call__(self, gate_up: jax.Array) -> jax.Array:
        if self.kernels == "fused":
            from kernels.pallas import silu_and_mul  # imports pallas: only on the fused path

            return silu_and_mul(gate_up)
        return reference.silu_and_mul_reference(gate_up)  # [..., 2I] -> [..., I]


class GeluTanhAndMul(nnx.Module):
    """GeGLU (Gemma): gelu_tanh(gate) * up on a merged [..., 2I] input, gate first."""

    def __init__(self, *, kernels: str = "reference"):
        self.kernels = kernels

    def __call__(self, gate_up: jax.Array) -> jax.Array:
        if self.kernels == "fused":
            try:
                from kernels.pallas import gelu_tanh_and_mul  # imports pallas: only on the fused path
            except ImportError as err:
                raise NotImplementedError(
                    "kernels='fused': kernels.pallas has no gelu_tanh_and_mul kernel yet (GeGLU); use "
                    "kernels='reference'"
                ) from err
            return gelu_tanh_and_mul(gate_up)
        return reference.gelu_tanh_and_mul_reference(gate_up)  # [..., 2I] -> [..., I]


class GeluAndMul(nnx.Module):
    """Gated exact-erf GELU (a Gemma config's hidden_activation "gelu"): no kernel, the reference math on both
    paths: to_dtype(gelu(fp32 gate) * fp32 up)."""

    def __init__(self, *, kernels: str = "reference"):
        self.kernels = kernels

    def __call__(self, gate_up: jax.Array) -> jax.Array:
        reference.check_silu_and_mul_args(gate_up, op="gelu_and_mul")
        gate, up = jnp.split(gate_up.astype(jnp.float32), 2, axis=-1)  # [..., I] each
        return (activation("gelu", gate) * up).astype(gate_up.dtype)


GATED = {"silu": SiluAndMul, "gelu_tanh": GeluTanhAndMul, "gelu": GeluAndMul}  # hidden_act -> the gated module


def activation(name: str, x: jax.Array) -> jax.Array:
    """The non-gated MLP's activation ("silu", "gelu_tanh", "gelu" exact erf) in float32, cast once."""
    xf = x.astype(jnp.float32)
    if name == "silu":
        out = xf / (1.0 + jnp.exp(-xf))  # torch's formula (see silu_and_mul_reference)
    elif name == "gelu_tanh":
        inner = jnp.float32(math.sqrt(2.0 / math.pi)) * (xf + 0.044715 * xf * xf * xf)
        out = 0.5 * xf * (1.0 + jnp.tanh(inner))
    elif name == "gelu":
        out = 0.5 * xf * (1.0 + jax.lax.erf(xf * jnp.float32(1.0 / math.sqrt(2.0))))  # torch's exact GELU
    else:
        raise NotImplementedError(f"hidden_act {name!r} is not implemented (silu, gelu_tanh, gelu)")
    return out.astype(x.dtype)
