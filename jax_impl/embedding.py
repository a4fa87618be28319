"""Token embedding as a row gather, and the tied LM head that reuses the same table.

Mirrors torch_impl/embedding.py. The table E is [V, H]; `__call__` gathers rows (never a one-hot
matmul); `attend` computes x @ E^T from the very same Param, so a tied model has no head parameter.
Ids are validated before they reach here: jnp.take would clamp or return NaN for a bad id. With tp > 1 the
table's rows are split over the mesh's "model" axis and the gather is vocabulary-parallel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl.vocab_parallel import vocab_parallel_embedding

HIGHEST = jax.lax.Precision.HIGHEST  # full fp32 matmuls on GPU too: parity is the point


class Embedding(nnx.Module):
    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: jnp.dtype, tp: int = 1, rngs: nnx.Rngs):
        self.tp = tp  # > 1: rows split over the mesh's "model" axis (vocabulary-parallel)
        self.weight = nnx.Param(jax.random.normal(rngs.params(), (vocab_size, hidden_size), dtype))  # [V, H]

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        if self.tp > 1:
            return vocab_parallel_embedding(input_ids, self.weight[...])  # each device gathers its own rows
        return jnp.take(self.weight[...], input_ids, axis=0)  # [B, T] -> [B, T, H]

    def attend(self, x: jax.Array) -> jax.Array:
        """Tied logits: x @ E^T with E the embedding table itself."""
        return jnp.einsum("bth,vh->btv", x, self.weight[...], precision=HIGHEST)  # [B, T, V]
