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
from jax_impl.vocab_parallel import DATA, EXPERT, MODEL
from spec import ConfigError, ParamEntry, check_token_ids
from spec.parallel import split_axis
from spec.params import LINEAR


def make_mesh(tp: int, dp: int = 1, ep: int = 1) -> Mesh:
    """A (data=dp, model=tp) mesh over the first dp * tp devices (simulated CPU devices work too); with ep > 1 a
    (data=dp, expert=ep, model=tp) mesh over dp * ep * tp devices (jax_impl/expert_parallel.py)."""
    devices, n = jax.devices(), dp * ep * tp
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ConfigError(f"expert-parallel degree must be a positive integer, got {ep!r}")
    if n > len(devices):
        shape = f"data={dp} x {f'expert={ep} x ' if ep > 1 else ''}model={tp}"
        raise ConfigError(
            f"a mesh of {shape} needs {n} devices, JAX sees {len(devices)} (on CPU call "
            f"parity.prepare_environment(tp={n}) or jax.config.update('jax_num_cpu_devices', {n}) "
            "before any JAX computation)"
        )
    shape, names = ((dp, ep, tp), (DATA, EXPERT, MODEL)) if ep > 1 else ((dp, tp), (DATA, MODEL))
    # Auto axes: XLA's partitioner propagates the parameter shardings through the model's plain jnp code.
    auto = (jax.sharding.AxisType.Auto,) * len(shape)
    return jax.make_mesh(shape, names, axis_types=auto, devices=devices[:n])


def mesh_degrees(mesh: Mesh | None) -> tuple[int, int]:
    """(tp, ep) of a mesh (1, 1 without one)."""
    if mesh is None:
        return 1, 1
    sizes = dict(mesh.shape)
    return sizes[MODEL], sizes.get(EXPERT, 1)


def partition_spec(entry: ParamEntry, ndim: int, ep: int = 1) -> P:
    """Where a runtime parameter's axes live, in Flax layout (Linear kernels [in, out], the loader's transpose).

    A stacked experts parameter ([E, in, out]) has its [E] axis first: the table's split axis (one expert's
    tensor's) moves up by one, and [E] lives on "expert" when ep > 1."""
    names: list[str | None] = [None] * ndim
    axis = split_axis(entry)
    if entry.expert is not None:
        axis = None if axis is None else axis + 1
        if ep > 1:
            names[0] = EXPERT
    if axis is not None:
        if entry.kind == LINEAR:
            axis = 2 * ndim - 3 - axis  # the last two swap: torch [..., out, in] -> Flax [..., in, out]
        names[axis] = MODEL
    return P(*names)


def place_shards(pieces: list[np.ndarray] | dict[tuple[int, int], np.ndarray], mesh: Mesh, pspec: P) -> jax.Array:
    """Each rank's host slice -> one global array; a device receives only its own slice. `pieces`: a list in
    "model" order, or {(expert coordinate, model coordinate): slice} on a mesh with an "expert" axis."""
    if isinstance(pieces, list):
        pieces = {(0, r): piece for r, piece in enumerate(pieces)}
    sharding = NamedSharding(mesh, pspec)
    shape = list(next(iter(pieces.values())).shape)
    for i, name in enumerate(pspec):
        shape[i] *= mesh.shape[name] if name in (MODEL, EXPERT) else 1
    names = mesh.axis_names
    coords = {mesh.devices[index]: dict(zip(names, index, strict=True)) for index in np.ndindex(mesh.devices.shape)}

    def piece(device) -> np.ndarray:
        at = coords[device]
        return pieces[(at[EXPERT] if EXPERT in pspec else 0, at[MODEL] if MODEL in pspec else 0)]

    arrays = [jax.device_put(piece(d), d) for d in sharding.addressable_devices]
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
    return on_mesh(mesh, partial(_sharded_logits, graphdef, state), ids.astype(np.int32), np.ones(ids.shape, bool))


def on_mesh(mesh: Mesh, fn: Callable, *batch: np.ndarray):
    """fn(*batch) under `mesh`, each host array's rows placed over its "data" axis (the rest replicated)."""
    rows = NamedSharding(mesh, P(DATA, None))
    with jax.set_mesh(mesh):
        return fn(*[jax.device_put(a, rows) for a in batch])


def sharded_steps(mesh: Mesh, steps: tuple[Callable, Callable], leaves: list[jax.Array], cache):
    """(prefill, decode_step, cache placed on the mesh): generate.step_functions' pair, jit-compiled with
    explicit in/out shardings. The steps take the state's flat leaves (`leaves`, as placed)."""
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
