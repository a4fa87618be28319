"""Tensor parallelism on a JAX mesh: placements from the partition table, sharded forward and decoding.

Mirrors torch_impl/tensor_parallel.py. A `Mesh` has a "data" axis (the batch) and a "model" axis (tensor
parallel, degree `tp`). JAX runs one global model, built from `ShardLayout.global_spec` (every rank's shards
side by side: replicated kv heads once per rank, the vocabulary padded); the loader (jax_impl/loader.py,
the same one as tp = 1) reads rank r's slice of every tensor from the memory map exactly as a torch rank
does (spec/parallel.py) and places it on the devices at "model" coordinate r. `partition_spec` turns an
entry's placement into where its axis lives:

    COLUMN    output features over "model" (q/k/v, gate_up; Flax kernels are [in, out])
    ROW       input features over "model"; XLA inserts the all-reduce after the product (o_proj, down)
    VOCAB     vocabulary rows over "model" (embedding; an untied head's output features)
    REPLICATED  on every device (norms)

Logits stay vocabulary-sharded; greedy decoding reduces only [B] values and ids across devices
(vocab_parallel.py), and `gather_logits` is the explicit request for whole logits.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_impl.kv_cache import DONATE_CACHE
from jax_impl.model import attention_masks, default_positions
from jax_impl.vocab_parallel import DATA, MODEL
from spec import ConfigError, ParamEntry, check_token_ids
from spec.parallel import split_axis
from spec.params import LINEAR


def make_mesh(tp: int, dp: int = 1) -> Mesh:
    """A (data=dp, model=tp) mesh over the first dp * tp devices (simulated CPU devices work too)."""
    devices = jax.devices()
    if dp * tp > len(devices):
        raise ConfigError(
            f"a mesh of data={dp} x model={tp} needs {dp * tp} devices, JAX sees {len(devices)} (on CPU call "
            f"parity.prepare_environment(tp={dp * tp}) or jax.config.update('jax_num_cpu_devices', {dp * tp}) "
            "before any JAX computation)"
        )
    # Auto axes: XLA's partitioner propagates the parameter shardings through the model's plain jnp code.
    auto = (jax.sharding.AxisType.Auto,) * 2
    return jax.make_mesh((dp, tp), (DATA, MODEL), axis_types=auto, devices=devices[: dp * tp])


def partition_spec(entry: ParamEntry, ndim: int) -> P:
    """Where a runtime parameter's axes live, in Flax layout (Linear kernels [in, out], the loader's transpose)."""
    axis = split_axis(entry)
    if axis is None:
        return P()
    if entry.kind == LINEAR:
        axis = 1 - axis  # torch [out, in] -> Flax [in, out]
    return P(*(MODEL if i == axis else None for i in range(ndim)))


def place_shards(pieces: list[np.ndarray], mesh: Mesh, pspec: P) -> jax.Array:
    """Each rank's host slice (in "model" order) -> one global array; a device receives only its own slice."""
    sharding = NamedSharding(mesh, pspec)
    axis = next((i for i, name in enumerate(pspec) if name == MODEL), None)
    shape = list(pieces[0].shape)
    if axis is not None:
        shape[axis] *= len(pieces)
    rank_of = {d: r for r in range(mesh.shape[MODEL]) for d in mesh.devices[:, r]}
    arrays = [jax.device_put(pieces[rank_of[d]], d) for d in sharding.addressable_devices]
    return jax.make_array_from_single_device_arrays(tuple(shape), sharding, arrays)


@partial(jax.jit, static_argnames=("graphdef",))
def _sharded_logits(graphdef, state, ids, key_valid):
    model = nnx.merge(graphdef, state)
    t = ids.shape[1]
    logits, _ = model.logits(ids, default_positions(key_valid, 0, t), attention_masks(model.spec, key_valid, 0, t))
    return logits


def sharded_logits(model, ids: np.ndarray, mesh: Mesh) -> jax.Array:
    """Uncached forward on the mesh: logits [B, T, V_pad] that stay sharded over the vocabulary."""
    ids = check_token_ids(ids, model.spec)
    graphdef, state = nnx.split(model)
    with jax.set_mesh(mesh):
        rows = NamedSharding(mesh, P(DATA, None))
        ids_d = jax.device_put(ids.astype(np.int32), rows)
        valid = jax.device_put(np.ones(ids.shape, bool), rows)
        return _sharded_logits(graphdef, state, ids_d, valid)


def sharded_steps(mesh: Mesh, steps: tuple[Callable, Callable], state: nnx.State, cache):
    """(prefill, decode_step, cache placed on the mesh): generate.step_functions' pair, jit-compiled with
    explicit in/out shardings. The steps take the state's flat leaves."""
    leaves = jax.tree.leaves(state)
    kv = NamedSharding(mesh, P(DATA, MODEL, None, None))  # k, v [B, n_kv, ...]: every rank's kv heads
    scalar = NamedSharding(mesh, P())
    # k, v (a ring layer's too) by kv head; length, requested replicated; max_len, ring are static structure
    cache_sh = jax.tree.map(lambda a: kv if a.ndim == 4 else scalar, cache)
    cache = jax.device_put(cache, cache_sh)
    prefill, decode = _compile(mesh, *steps, tuple(a.sharding for a in leaves), cache_sh)
    return prefill, decode, cache


@lru_cache(maxsize=8)
def _compile(mesh: Mesh, prefill: Callable, decode_step: Callable, leaf_shardings: tuple, cache_sh):
    state_sh = list(leaf_shardings)  # the leaves travel as a list
    rows, rows2 = NamedSharding(mesh, P(DATA)), NamedSharding(mesh, P(DATA, None))
    rep, logits = NamedSharding(mesh, P()), NamedSharding(mesh, P(DATA, MODEL))  # logits stay vocabulary-sharded
    prefill = jax.jit(
        prefill, **DONATE_CACHE,
        in_shardings=(state_sh, cache_sh, rows2, rows2, rep, rep),
        out_shardings=(rows, logits, cache_sh, rows),
    )  # fmt: skip
    decode = jax.jit(
        decode_step, **DONATE_CACHE,
        in_shardings=(state_sh, cache_sh, rows, rows2, rows, rep, rep),
        out_shardings=(rows, logits, cache_sh, rows2, rows),
    )  # fmt: skip
    return prefill, decode
