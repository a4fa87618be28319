"""Token embedding as a row gather, and the tied LM head that reuses the same table.

Mirrors torch_impl/embedding.py. The table E is [V, H]; `__call__` gathers rows (never a one-hot
matmul); `attend` computes x @ E^T from the very same Param, so a tied model has no head parameter.
Ids are validated before they reach here: jnp.take would clamp or return NaN for a bad id. With tp > 1 the
table's rows are split over the mesh's "model" axis and the gather is vocabulary-parallel.

`pad_token_id` (spec.ModelSpec, a global id) is transformers' padding_idx: the lookup gives that row no gradient,
the forward is unchanged, and a tied head's use of the table still trains it (docs/design.md, "Training").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl.linear import product
from jax_impl.vocab_parallel import no_pad_gradient, vocab_parallel_embedding

HIGHEST = jax.lax.Precision.HIGHEST  # full fp32 matmuls on GPU too: parity is the point


class Embedding(nnx.Module):
    def __init__(
        self, vocab_size: int, hidden_size: int, *, dtype: jnp.dtype, tp: int = 1, pad_token_id: int | None = None,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        self.tp = tp  # > 1: rows split over the mesh's "model" axis (vocabulary-parallel)
        self.pad_token_id = pad_token_id  # global id of the row the lookup does not train (None: every row trains)
        self.weight = nnx.Param(jax.random.normal(rngs.params(), (vocab_size, hidden_size), dtype))  # [V, H]

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        if self.tp > 1:
            return vocab_parallel_embedding(input_ids, self.weight[...], self.pad_token_id)  # each its own rows
        return no_pad_gradient(jnp.take(self.weight[...], input_ids, axis=0), input_ids, self.pad_token_id)  # [B, T, H]

    def attend(self, x: jax.Array) -> jax.Array:
        """Tied logits: x @ E^T with E the embedding table itself."""
        return product(x, self.weight[...], precision=HIGHEST)  # [B, T, H] -> [B, T, V], in the form chosen by shape
