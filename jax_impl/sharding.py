"""Tensor parallelism on a JAX mesh: partition rules applied at load, sharded forward and greedy decoding.

The JAX twin of torch_impl/tensor_parallel.py. A `Mesh` has a "data" axis (the batch) and a "model"
axis (tensor parallel). Column-parallel q/k/v and gate_up, row-parallel o and down (XLA inserts the
all-reduce after them), a vocabulary-parallel embedding and tied head: every parameter is placed shard by
shard at load (`jax_impl.from_pretrained(path, mesh=mesh)`), so a device never holds more than its part.
The vocabulary is padded to a multiple of the degree (padding rows are zero, their logits -inf); logits
stay vocabulary-sharded and greedy decoding reduces only [B] values and ids across devices.
"""

from __future__ import annotations

from functools import lru_cache, partial

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_impl.vocab_parallel import DATA, MODEL
from spec import ConfigError, ModelSpec
from spec.parallel import padded_vocab
from spec.params import BIAS, EMBEDDING


def make_mesh(tp: int, dp: int = 1) -> Mesh:
    """A (data=dp, model=tp) mesh over the first dp * tp devices (simulated CPU devices work too)."""
    devices = jax.devices()
    if dp * tp > len(devices):
        raise ConfigError(
            f"a mesh of data={dp} x model={tp} needs {dp * tp} devices, JAX sees {len(devices)} (on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={dp * tp} before importing jax)"
        )
    # Auto axes: XLA's partitioner propagates the parameter shardings through the model's plain jnp code.
    auto = (jax.sharding.AxisType.Auto,) * 2
    return jax.make_mesh((dp, tp), (DATA, MODEL), axis_types=auto, devices=devices[: dp * tp])


def partition_spec(spec: ModelSpec, module: str, role: str, kind: str, tp: int) -> P:
    """Where each parameter lives, in Flax layout (Linear kernels [in, out])."""
    name = module.rsplit(".", 1)[-1]
    kv_split = spec.num_key_value_heads % tp == 0
    if kind == EMBEDDING:
        return P(MODEL, None)  # vocabulary rows
    if name in ("q_proj", "gate_up_proj") or (name in ("k_proj", "v_proj") and kv_split) or name == "lm_head":
        return P(MODEL) if kind == BIAS else P(None, MODEL)  # column-parallel: output features
    if name in ("o_proj", "down_proj"):
        return P(MODEL, None)  # row-parallel: input features; XLA all-reduces the partial sums
    return P()  # norms, and k/v replicated when tp exceeds the kv heads


def shard_layout(spec: ModelSpec, module: str, array: np.ndarray, tp: int) -> np.ndarray:
    """Host-side layout changes (torch layout in and out): pad vocabulary rows, group gate_up per shard."""
    name = module.rsplit(".", 1)[-1]
    if name in ("embed_tokens", "lm_head"):
        pad = padded_vocab(spec, tp) - array.shape[0]
        return np.concatenate([array, np.zeros((pad, *array.shape[1:]), array.dtype)]) if pad else array
    if name == "gate_up_proj":  # [gate; up] -> [gate_0; up_0; gate_1; up_1; ...] so each shard splits locally
        i, h = spec.intermediate_size, array.shape[1]
        halves = array.reshape(2, tp, i // tp, h)  # [gate|up, shard, I/tp, H]
        return halves.transpose(1, 0, 2, 3).reshape(2 * i, h)
    return array


def place(value: np.ndarray, mesh: Mesh, pspec: P) -> jax.Array:
    """Host array -> a global array whose every device receives only its own slice."""
    return jax.device_put(value, NamedSharding(mesh, pspec))


@partial(jax.jit, static_argnames=("graphdef",))
def _sharded_logits(graphdef, state, ids, key_valid):
    from jax_impl.model import causal_mask, default_positions

    model = nnx.merge(graphdef, state)
    t = ids.shape[1]
    logits, _ = model.logits(ids, default_positions(key_valid, 0, t), causal_mask(key_valid, 0, t))
    return logits


def sharded_logits(model, ids: np.ndarray, mesh: Mesh) -> jax.Array:
    """Uncached forward on the mesh: logits [B, T, V_pad] that stay sharded over the vocabulary."""
    from spec import check_token_ids

    ids = check_token_ids(np.asarray(ids), model.spec)
    graphdef, state = nnx.split(model)
    with jax.set_mesh(mesh):
        ids_d = place(ids.astype(np.int32), mesh, P(DATA, None))
        valid = place(np.ones(ids.shape, bool), mesh, P(DATA, None))
        return _sharded_logits(graphdef, state, ids_d, valid)


def gather_logits(logits: jax.Array, spec: ModelSpec) -> np.ndarray:
    """The explicit request for full logits: gather to the host and drop the vocabulary padding."""
    return np.asarray(logits)[..., : spec.vocab_size]


def cache_partition(num_kv_heads: int, tp: int) -> P:
    """KV cache [B, n_kv, ...]: batch over "data", kv heads over "model" when they split, else replicated."""
    return P(DATA, MODEL, None, None) if num_kv_heads % tp == 0 else P(DATA, None, None, None)


def sharded_steps(mesh: Mesh, graphdef: nnx.GraphDef, params, state: nnx.State, cache):
    """(prefill, decode_step, cache placed on the mesh), jit-compiled with explicit in/out shardings.

    The steps take the state's flat leaves, as generate.compiled_steps's do.
    """
    leaves, treedef = jax.tree.flatten(state)
    kv = NamedSharding(mesh, cache_partition(cache.k[0].shape[1], mesh.shape[MODEL]))  # k, v [B, n_kv, ...]
    cache_sh = type(cache)(tuple(kv for _ in cache.k), tuple(kv for _ in cache.v), NamedSharding(mesh, P()))
    cache = jax.device_put(cache, cache_sh)
    steps = _steps(mesh, graphdef, treedef, params, tuple(a.sharding for a in leaves), cache_sh)
    return (*steps, cache)


@lru_cache(maxsize=8)
def _steps(mesh: Mesh, graphdef: nnx.GraphDef, treedef, params, leaf_shardings: tuple, cache_sh):
    from jax_impl.generate import DONATE_CACHE, step_functions

    prefill, decode_step = step_functions(graphdef, treedef, params)
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
