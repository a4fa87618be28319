"""Expert parallelism on a JAX mesh: a sparse layer's stacked experts split over the mesh's "expert" axis.

Mirrors torch_impl/expert_parallel.py. The mesh (`tensor_parallel.make_mesh(tp, dp, ep)`) is (data, expert,
model); every stacked experts parameter ([E, in, out] in Flax layout) has its [E] axis over "expert", so the device
at expert coordinate q holds experts `spec.parallel.expert_range(spec, ep, q)` (a contiguous run, as a torch EP
rank does; the loader reads only those from the memory map), and its "model" axis split by tensor parallelism as
a dense MLP's. Everything else is replicated over "expert".

Dispatch, under `jax.shard_map` manual over "expert" only ("data" and "model" stay with XLA's partitioner, so it
composes with tensor parallelism): the tokens of a data shard are already on every expert rank (they are
replicated over "expert"), so each rank runs the phase's dispatch form (jax_impl/moe.py) on the (token, slot)
pairs routed to its own experts, zeroes the others, and a psum over "expert" combines them: the all-to-all's
equivalent for replicated tokens (an all-to-all would first have to split the tokens, then bring them back). Each
slot's output comes from exactly one rank and the others add exact zeros, so the sum is the unsharded value.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jax_impl.vocab_parallel import EXPERT


def sharded_experts(form: Callable, x: jax.Array, ids: jax.Array, w_gu: jax.Array, w_down: jax.Array,
                    act: Callable) -> jax.Array:  # fmt: skip
    """x [N, H], ids [N, k] (global expert ids), stacked kernels sharded on [E] over "expert" -> [N, k, H]."""

    def local(x, ids, w_gu, w_down):
        x = x[0]  # [N, H]: this rank's copy
        n_local = w_gu.shape[0]
        first = jax.lax.axis_index(EXPERT) * n_local
        mine = (ids >= first) & (ids < first + n_local)  # [N, k]: pairs routed to this rank's experts
        out = form(x, jnp.where(mine, ids - first, 0), w_gu, w_down, act)  # [N, k, H]; others read expert 0
        return jax.lax.psum(jnp.where(mine[..., None], out, 0), EXPERT)

    ep = jax.sharding.get_abstract_mesh().shape[EXPERT]
    # One copy of the tokens per rank, made outside the shard_map: the backward of this broadcast sums the ranks'
    # input gradients. (Passed in replicated, the gradient of a row gather of it came back unsummed: 0.98 rel
    # error, measured; the einsum-only forms were right either way.)
    copies = jnp.broadcast_to(x[None], (ep, *x.shape))  # [ep, N, H]
    experts = P(EXPERT, None, None)
    specs = dict(in_specs=(experts, P(), experts, experts), out_specs=P(), axis_names=frozenset({EXPERT}))
    return jax.shard_map(local, **specs)(copies, ids, w_gu, w_down)
