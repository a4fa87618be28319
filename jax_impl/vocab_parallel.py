"""Vocabulary-parallel collectives: the embedding gather and the greedy argmax over a sharded vocabulary.

Mirrors the vocabulary-parallel parts of torch_impl's tensor parallelism. Both run under `jax.shard_map`
on the mesh set by `jax.set_mesh` (jax_impl/sharding.py): each device sees only its rows [start, end) of
the vocabulary, so neither the table nor the [B, T, V] logits are ever gathered whole.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

DATA, MODEL = "data", "model"


def vocab_parallel_take(table: jax.Array, ids: jax.Array) -> jax.Array:
    """table [V_pad, H] sharded on V, ids [B, T] -> rows [B, T, H]: local gather, zero elsewhere, psum."""

    def local(table_shard: jax.Array, ids_shard: jax.Array) -> jax.Array:
        rows = table_shard.shape[0]
        local_ids = ids_shard - jax.lax.axis_index(MODEL) * rows
        inside = (local_ids >= 0) & (local_ids < rows)  # ids owned by this shard
        gathered = jnp.take(table_shard, jnp.where(inside, local_ids, 0), axis=0)  # [B, T, H]
        return jax.lax.psum(jnp.where(inside[..., None], gathered, 0), MODEL)

    return jax.shard_map(local, in_specs=(P(MODEL, None), P(DATA, None)), out_specs=P(DATA, None, None))(table, ids)


def vocab_parallel_argmax(logits: jax.Array) -> jax.Array:
    """logits [B, V_pad] sharded on V -> the global argmax [B], ties to the lowest id, from [B] values only.

    Each shard takes its local max and argmax; a max-reduction finds the winning value and a min-reduction
    over the shards holding it picks the lowest global id, exactly what jnp.argmax of the whole row gives.
    """

    def local(shard: jax.Array) -> jax.Array:
        width = shard.shape[-1]
        value = jnp.max(shard, axis=-1)  # [B]
        index = jnp.argmax(shard, axis=-1).astype(jnp.int32) + jax.lax.axis_index(MODEL) * width
        best = jax.lax.pmax(value, MODEL)
        candidate = jnp.where(value == best, index, jnp.iinfo(jnp.int32).max)
        return jax.lax.pmin(candidate, MODEL)

    return jax.shard_map(local, in_specs=P(DATA, MODEL), out_specs=P(DATA))(logits)
