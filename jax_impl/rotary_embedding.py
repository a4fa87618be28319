"""Rotary position embedding, rotate-half convention (the Hugging Face / Qwen / Llama / GPT-NeoX layout).

Mirrors torch_impl/rotary_embedding.py. Frequencies (theta and any linear / llama3 scaling) come from
the spec as float32, identical bits in both backends; under jit they are a constant. One table per layer type
that has its own RoPE (Gemma 3's sliding layers: spec.rope_kinds). Angles, cos, sin and the rotation are computed
in float32 and cast once to the activation dtype. Partial rotary (GPT-NeoX) rotates the first rotary_dim dims of
each head and passes the rest through.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from spec import ModelSpec
from spec.families import FULL


def rotate_half(x: jax.Array) -> jax.Array:
    """[x1, x2] -> [-x2, x1] over the last dim: pairs are (i, i + d/2), not (2i, 2i + 1)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate((-x2, x1), axis=-1)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, n, d]; cos, sin [B, T, r] float32 with r = rotary_dim <= d: the first r dims rotate."""
    r = cos.shape[-1]
    xf = x.astype(jnp.float32)
    rot = xf[..., :r] if r < x.shape[-1] else xf  # [B, T, n, r]
    out = rot * cos[:, :, None, :] + rotate_half(rot) * sin[:, :, None, :]
    if r < x.shape[-1]:  # partial rotary: the unrotated tail passes through unchanged
        out = jnp.concatenate((out, xf[..., r:]), axis=-1)  # [B, T, n, d]
    return out.astype(x.dtype)


class RotaryEmbedding(nnx.Module):
    def __init__(self, spec: ModelSpec, layer_type: str = FULL):
        self.spec = spec  # static: frozen and hashable, so jit caches on it
        self.layer_type = layer_type  # whose frequencies: full layers', or sliding layers' own (Gemma 3)

    def __call__(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """positions [B, T] int -> (cos, sin), each [B, T, rotary_dim] float32."""
        inv_freq = jnp.asarray(self.spec.inv_freq(self.layer_type))  # [r/2] fp32
        freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, r/2]
        halves = jnp.stack((jnp.cos(freqs), jnp.sin(freqs)))  # [2, B, T, r/2]
        # cos and sin of the angles [freqs, freqs], each half written twice by a product with [I I]: exact (every
        # output is one value times 1 plus products with 0). Written as cos(concatenate(...)), XLA:CPU fuses the
        # cos and sin into each consumer and evaluates them again for every head of every layer's q and k
        # (docs/design.md, "The kernels"); a product's result is computed once.
        eye = jnp.eye(freqs.shape[-1], dtype=jnp.float32)
        twice = jnp.concatenate((eye, eye), axis=1)  # [r/2, r]
        cos, sin = jnp.einsum("cbtf,fr->cbtr", halves, twice, precision=jax.lax.Precision.HIGHEST)  # [B, T, r] each
        return cos, sin
