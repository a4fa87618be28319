"""Rotary position embedding, rotate-half convention (the Hugging Face / Qwen / Llama layout).

Mirrors torch_impl/rotary_embedding.py. Frequencies (theta and any linear / llama3 scaling) come from
the spec as float32, identical bits in both backends; under jit they are a constant. Angles, cos, sin
and the rotation are computed in float32 and cast once to the activation dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from spec import ModelSpec


def rotate_half(x: jax.Array) -> jax.Array:
    """[x1, x2] -> [-x2, x1] over the last dim: pairs are (i, i + d/2), not (2i, 2i + 1)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate((-x2, x1), axis=-1)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, n, d]; cos, sin [B, T, d] float32."""
    xf = x.astype(jnp.float32)
    out = xf * cos[:, :, None, :] + rotate_half(xf) * sin[:, :, None, :]
    return out.astype(x.dtype)


class RotaryEmbedding(nnx.Module):
    def __init__(self, spec: ModelSpec):
        self.spec = spec  # static: frozen and hashable, so jit caches on it

    def __call__(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """positions [B, T] int -> (cos, sin), each [B, T, d] float32."""
        inv_freq = jnp.asarray(self.spec.inv_freq())  # [d/2] fp32
        freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, d/2]
        angles = jnp.concatenate((freqs, freqs), axis=-1)  # [B, T, d]
        return jnp.cos(angles), jnp.sin(angles)
