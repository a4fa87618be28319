"""Run in a subprocess with N simulated CPU devices (set by parity.prepare_environment before JAX starts): an MoE
checkpoint on a (data, expert, model) mesh against the unsharded model. Prints one JSON line that
tests/jax_impl/test_expert_parallel.py asserts on."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(directory: str, tp: int, ep: int) -> dict:
    import jax
    import numpy as np

    import jax_impl
    from jax_impl import tensor_parallel, training
    from jax_impl.vocab_parallel import EXPERT, gather_logits
    from spec.parallel import expert_range
    from tests.greedy import assert_same_greedy

    ref = jax_impl.from_pretrained(directory)
    spec = ref.spec
    ids = np.random.default_rng(0).integers(0, spec.vocab_size, (2, 11))
    full = np.asarray(ref(ids))
    mesh = tensor_parallel.make_mesh(tp, 1, ep)
    model = jax_impl.from_pretrained(directory, mesh=mesh)
    out: dict = {"mesh": dict(mesh.shape)}
    for form in ("tiled", "gather", "dense", "ragged"):  # every dispatch form, each under shard_map
        for layer in model.model.layers:
            if layer.sparse:
                layer.mlp.dispatch = form
        logits = gather_logits(tensor_parallel.sharded_logits(model, ids, mesh), spec.vocab_size)
        out[f"rel_err_{form}"] = float(np.abs(np.asarray(logits) - full).max() / np.abs(full).max())
    for layer in model.model.layers:
        if layer.sparse:
            layer.mlp.dispatch = None
    # CausalLM.__call__ on the sharded model (under its mesh): logits, trace and teacher-forced routing
    trace: dict = {}
    whole = np.asarray(model(ids, trace=trace))[..., : spec.vocab_size]
    out["call_rel_err"] = float(np.abs(whole - full).max() / np.abs(full).max())
    own = {i: np.asarray(trace[f"layers.{i}.moe.topk_ids"]) for i in spec.sparse_layers}
    forced = np.asarray(model(ids, routing=own))[..., : spec.vocab_size]
    out["forced_rel_err"] = float(np.abs(forced - whole).max() / np.abs(whole).max())
    # Each device holds its expert coordinate's run of experts, as a torch EP rank would (down_proj [E, Im, H]:
    # its tensor-parallel split is a contiguous run of Im too; gate_up's is [gate_r | up_r] per rank).
    layer = spec.sparse_layers[0]
    stacked = model.model.layers[layer].mlp.experts.down_proj.kernel[...]
    ref_stacked = np.asarray(ref.model.layers[layer].mlp.experts.down_proj.kernel[...])
    names = mesh.axis_names
    placed = []
    for shard in stacked.addressable_shards:
        index = next(i for i in np.ndindex(mesh.devices.shape) if mesh.devices[i] == shard.device)
        q = dict(zip(names, index, strict=True)).get(EXPERT, 0)
        run = expert_range(spec, ep, q)
        at = shard.index[0]  # the global experts this device holds
        same = np.array_equal(np.asarray(shard.data), ref_stacked[shard.index])
        placed.append(bool(same and range(*at.indices(spec.num_experts)) == run))
    out["experts_placed"] = placed
    out["expert_shard_sizes"] = sorted({s.data.shape[0] for s in stacked.addressable_shards})
    alone = jax_impl.generate(ref, ids[:1], 10, eos_token_ids=(), return_logits=True)
    sharded = jax_impl.generate(model, ids[:1], 10, eos_token_ids=(), mesh=mesh).tokens
    try:
        out["near_ties"] = assert_same_greedy({"unsharded": alone.tokens, "sharded": sharded}, alone.logits)
        out["greedy_identical"] = True
    except AssertionError as err:
        out["greedy_identical"] = str(err)
    loss, grads = training.loss_and_grads(model, ids)
    ref_loss, ref_grads = training.loss_and_grads(ref, ids)
    out["grad_names_equal"] = sorted(grads) == sorted(ref_grads)
    out["grad_loss_rel"] = abs(loss - ref_loss) / ref_loss
    out["grad_rel_err"] = max(float(np.abs(grads[n] - ref_grads[n]).max() / np.abs(ref_grads[n]).max()) for n in grads)
    del jax
    return out


if __name__ == "__main__":
    directory, devices, tp, ep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a script's path is its folder: find `tests`
    from parity.environment import prepare_environment

    prepare_environment(tp=devices)  # before JAX starts: the one place the device count is set
    print(json.dumps(main(directory, tp, ep)))
