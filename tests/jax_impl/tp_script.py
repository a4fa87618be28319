"""Run in a subprocess with N simulated CPU devices (set by parity.prepare_environment before JAX starts).

Prints one JSON line, a list of measurements per configuration, that tests/jax_impl/test_tensor_parallel.py
asserts on.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def all_gathers_with_dim(hlo: str, dim: int) -> list[str]:
    """HLO all-gather instructions whose result shape has a dimension of size `dim`."""
    found = []
    for line in hlo.splitlines():
        if "all-gather" in line and "=" in line:
            shape = line.split("=", 1)[1].split("all-gather", 1)[0]
            if dim in [int(n) for n in re.findall(r"\d+", shape.split("{")[0])]:
                found.append(line.strip())
    return found


def main(directory: str, tp: int, dp: int) -> dict:
    import jax
    import numpy as np

    import jax_impl
    from jax_impl import tensor_parallel
    from jax_impl.vocab_parallel import gather_logits
    from tests.greedy import assert_same_greedy

    ref = jax_impl.from_pretrained(directory)
    spec = ref.spec
    ids = np.random.default_rng(0).integers(0, spec.vocab_size, (2 * dp, 11))
    full = np.asarray(ref(ids))
    mesh = tensor_parallel.make_mesh(tp, dp)
    model = jax_impl.from_pretrained(directory, mesh=mesh)
    logits = tensor_parallel.sharded_logits(model, ids, mesh)
    gathered = np.asarray(gather_logits(logits, spec.vocab_size))
    table = model.model.embed_tokens.weight[...]
    out = {
        "rel_err": float(np.abs(gathered - full).max() / np.abs(full).max()),
        "logits_spec": str(logits.sharding.spec),
        "table_shard_rows": sorted({s.data.shape[0] for s in table.addressable_shards}),
        "vocab_padded": int(table.shape[0]),
        "tied_no_head": model.lm_head is None,
        "gathered_spec": str(gather_logits(logits, spec.vocab_size).sharding.spec),
    }
    # The kv-head rule torch ranks follow: the device at "model" coordinate r holds kv head r * n_kv // tp.
    k_proj = model.model.layers[0].self_attn.k_proj.kernel[...]  # Flax [H, kv_heads_in_layout * d]
    k_ref = np.asarray(ref.model.layers[0].self_attn.k_proj.kernel[...])
    d, n_kv = spec.head_dim, spec.num_key_value_heads
    heads_ok = []
    for shard in k_proj.addressable_shards:
        rank = shard.index[1].start // shard.data.shape[1]
        per_rank = shard.data.shape[1] // d
        first = rank * n_kv // tp if n_kv < tp else rank * per_rank
        heads_ok.append(bool(np.array_equal(np.asarray(shard.data), k_ref[:, first * d : (first + per_rank) * d])))
    out["kv_heads_as_torch_ranks"] = heads_ok
    prompt = ids[:dp]
    alone = jax_impl.generate(ref, prompt, 12, eos_token_ids=(), return_logits=True)
    sharded = jax_impl.generate(model, prompt, 12, eos_token_ids=(), mesh=mesh).tokens
    try:  # identical except after a near-tie (tests/greedy.py): sharded sums run in another order
        out["near_ties"] = assert_same_greedy({"unsharded": alone.tokens, "sharded": sharded}, alone.logits)
        out["greedy_identical"] = True
    except AssertionError as err:
        out["greedy_identical"] = str(err)
    # The compiled greedy decode step: no all-gather may produce a full-vocabulary dimension.
    from flax import nnx

    from jax_impl.generate import SamplingParams, step_functions
    from jax_impl.kv_cache import KVCache

    graphdef, state = nnx.split(model)
    cache = KVCache.create(model.module_spec, dp, 16, table.dtype)
    steps = step_functions(graphdef, jax.tree.structure(state), SamplingParams())
    _, decode, cache = tensor_parallel.sharded_steps(mesh, steps, jax.tree.leaves(state), cache)
    with jax.set_mesh(mesh):
        args = (
            jax.tree.leaves(state),
            cache,
            np.zeros(dp, np.int32),
            np.ones((dp, 16), bool),
            np.zeros(dp, bool),
            jax.random.key(0),
            np.zeros(0, np.int32),
        )
        hlo = decode.lower(*args).compile().as_text()
    out["vocab_all_gathers"] = all_gathers_with_dim(hlo, int(table.shape[0])) + all_gathers_with_dim(
        hlo, spec.vocab_size
    )
    out["has_all_reduce"] = "all-reduce" in hlo
    # The compiled loss and gradients (jax_impl/training.py): the vocabulary-parallel loss gathers no logits.
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_impl import training
    from jax_impl.vocab_parallel import DATA
    from spec.training import check_labels

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    rows = NamedSharding(mesh, P(DATA, None))
    labels = check_labels(None, ids, spec)
    with jax.set_mesh(mesh):
        batch = [jax.device_put(a, rows) for a in (ids.astype(np.int32), np.ones(ids.shape, bool), labels)]
        grad_hlo = training._value_and_grad.lower(graphdef, params, rest, *batch).compile().as_text()
    padded = int(table.shape[0])
    out["grad_vocab_all_gathers"] = all_gathers_with_dim(grad_hlo, padded) + all_gathers_with_dim(
        grad_hlo, spec.vocab_size
    )
    loss, grads = training.loss_and_grads(model, ids)
    ref_loss, ref_grads = training.loss_and_grads(ref, ids)
    out["grad_loss_rel"] = abs(loss - ref_loss) / ref_loss
    out["grad_rel_err"] = max(float(np.abs(grads[n] - ref_grads[n]).max() / np.abs(ref_grads[n]).max()) for n in grads)
    return out


def control(tp: int) -> dict:
    """The detector's negative control: gathering vocabulary-sharded logits whole is seen as such."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_impl import tensor_parallel

    mesh = tensor_parallel.make_mesh(tp)
    gather = jax.jit(
        lambda logits: jnp.argmax(jax.lax.with_sharding_constraint(logits, NamedSharding(mesh, P())), -1),
        in_shardings=NamedSharding(mesh, P(None, tensor_parallel.MODEL)),
    )
    hlo = gather.lower(np.zeros((1, 264), np.float32)).compile().as_text()
    return {"control_gathers": all_gathers_with_dim(hlo, 264)}


if __name__ == "__main__":
    # DEVICES, then DIRECTORY TP DP per configuration: every configuration in one process (one JAX start, and the
    # unsharded model's programs compiled once for all of them); a mesh takes the first tp * dp of the devices.
    devices, configs = int(sys.argv[1]), [sys.argv[i : i + 3] for i in range(2, len(sys.argv), 3)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a script's path is its folder: find `tests`
    from parity.environment import prepare_environment

    prepare_environment(tp=devices)  # before JAX starts: the one place the device count is set
    runs = [{**main(d, int(tp), int(dp)), **control(int(tp))} for d, tp, dp in configs]
    print(json.dumps(runs))
