"""The vocabulary-parallel ends of a tensor-parallel model: embedding gather, padded logits, what reads them.

Mirrors torch_impl/vocab_parallel.py (same function names, same meaning). The embedding gather and the
greedy argmax run under `jax.shard_map` on the mesh set by `jax.set_mesh` (jax_impl/tensor_parallel.py):
each device sees only its rows of the padded vocabulary, so neither the table nor the [B, T, V] logits are
gathered whole; `gather_logits` is the explicit request that does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

DATA, MODEL = "data", "model"
EXPERT = "expert"  # expert parallelism's mesh axis (jax_impl/expert_parallel.py)


def no_pad_gradient(rows: jax.Array, input_ids: jax.Array, pad_token_id: int | None) -> jax.Array:
    """Gathered rows [B, T, H] of `input_ids` [B, T] with no gradient flowing back where the id is `pad_token_id`
    (transformers' padding_idx: the lookup does not train that row); the values are unchanged."""
    if pad_token_id is None:
        return rows
    return jnp.where((input_ids == pad_token_id)[..., None], jax.lax.stop_gradient(rows), rows)


def vocab_parallel_embedding(input_ids: jax.Array, weight: jax.Array, pad_token_id: int | None = None) -> jax.Array:
    """ids [B, T] (global, already validated), table [V_pad, H] sharded on V -> rows [B, T, H]: each device
    gathers the ids it owns, zero elsewhere, then a sum across devices. The shard holding row `pad_token_id`
    (global) gives it no gradient from the lookup."""

    def local(table_shard: jax.Array, ids_shard: jax.Array) -> jax.Array:
        rows = table_shard.shape[0]
        local_ids = ids_shard - jax.lax.axis_index(MODEL) * rows
        inside = (local_ids >= 0) & (local_ids < rows)  # ids owned by this shard
        gathered = jnp.take(table_shard, jnp.where(inside, local_ids, 0), axis=0)  # [B, T, H]
        gathered = no_pad_gradient(gathered, ids_shard, pad_token_id)
        return jax.lax.psum(jnp.where(inside[..., None], gathered, 0), MODEL)

    specs = dict(in_specs=(P(MODEL, None), P(DATA, None)), out_specs=P(DATA, None, None))
    return jax.shard_map(local, **specs)(weight, input_ids)


def mask_padding(logits: jax.Array, vocab_start: int, vocab_size: int) -> jax.Array:
    """logits [..., W] of rows [vocab_start, vocab_start + W): those at or past `vocab_size` -> -inf."""
    ids = vocab_start + jnp.arange(logits.shape[-1])
    return jnp.where(ids < vocab_size, logits, -jnp.inf)


def gather_logits(logits: jax.Array, vocab_size: int) -> jax.Array:
    """The explicit full gather: vocabulary-sharded [..., V_pad] -> [..., vocab_size] replicated on every device."""
    mesh = logits.sharding.mesh
    whole = jax.device_put(logits, jax.sharding.NamedSharding(mesh, P()))  # XLA's all-gather
    return whole[..., :vocab_size]


def greedy_token(logits: jax.Array) -> jax.Array:
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


def vocab_parallel_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean cross-entropy of vocabulary-sharded logits [B, T, V_pad] against targets [B, T] (-100: not counted),
    without gathering the vocabulary: per shard the local max, then a max across shards; the local sum of
    exponentials, then a sum; the target's logit from the shard that owns it, then a sum. The backward is
    local too: softmax minus the one-hot of the shard's own ids. Twin of torch_impl/vocab_parallel.py's."""
    specs = dict(in_specs=(P(DATA, None, MODEL), P(DATA, None)), out_specs=P())
    return jax.shard_map(_vocab_parallel_nll, **specs)(logits, targets)


@jax.custom_vjp
def _vocab_parallel_nll(shard: jax.Array, targets: jax.Array) -> jax.Array:
    return _vp_fwd(shard, targets)[0]


def _vp_fwd(shard, targets):
    width = shard.shape[-1]
    x = shard.astype(jnp.float32)  # [b, T, V/tp]
    top = jax.lax.pmax(jnp.max(x, axis=-1), MODEL)  # [b, T]
    lse = top + jnp.log(jax.lax.psum(jnp.exp(x - top[..., None]).sum(-1), MODEL))  # [b, T]
    local = targets - jax.lax.axis_index(MODEL) * width
    owned = (local >= 0) & (local < width)
    picked = jnp.take_along_axis(x, jnp.clip(local, 0, width - 1)[..., None], axis=-1)[..., 0]
    target = jax.lax.psum(jnp.where(owned, picked, 0.0), MODEL)  # [b, T]: from the owning shard
    counted = targets != -100
    count = jax.lax.psum(counted.sum(), DATA)
    value = jax.lax.psum(jnp.where(counted, lse - target, 0.0).sum(), DATA) / count
    return value, (shard, local, owned, counted, lse, count)


def _vp_bwd(residuals, grad):
    shard, local, owned, counted, lse, count = residuals
    p = jnp.exp(shard.astype(jnp.float32) - lse[..., None])  # [b, T, V/tp], this shard's softmax
    onehot = (jnp.arange(shard.shape[-1]) == local[..., None]) & owned[..., None]
    scale = jnp.where(counted, grad / count, 0.0)[..., None]
    return ((p - onehot) * scale).astype(shard.dtype), None


_vocab_parallel_nll.defvjp(_vp_fwd, _vp_bwd)
