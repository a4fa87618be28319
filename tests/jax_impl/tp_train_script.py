"""Run in a subprocess with N simulated CPU devices: AdamW steps of a tensor-parallel model against unsharded ones.

Prints one JSON line, a list of measurements per configuration, that tests/jax_impl/test_tensor_parallel.py asserts on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STEPS = 3


def main(directory: str, tp: int, full: bool) -> dict:
    """`full`: also the linear-regime step and the compiled step's all-gathers (once is enough per test run)."""
    import jax
    import numpy as np
    from flax import nnx

    import jax_impl
    from jax_impl import optimizer as opt
    from jax_impl import tensor_parallel, training
    from parity.gradients import compare_steps
    from spec.training import AdamW
    from tests.jax_impl.tp_script import all_gathers_with_dim

    ids = np.array([[0, 0, 0, 5, 17, 250, 3], [11, 262, 1, 2, 3, 4, 100]])  # row 0 left-padded by mask
    mask = np.array([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    ref = jax_impl.from_pretrained(directory)
    spec = ref.spec
    ids = ids % spec.vocab_size
    rng = np.random.default_rng(1)
    batches = [ids] + [rng.integers(0, spec.vocab_size, ids.shape) for _ in range(STEPS - 1)]
    config = AdamW(lr=1e-3, max_grad_norm=0.5)
    model = jax_impl.from_pretrained(directory, mesh=tensor_parallel.make_mesh(tp))
    out: dict = {}

    # The clipping norm: the replicated kv heads' gradient summed over their copies, each element counted once.
    _, ref_grads = training.loss_and_grads(ref, ids, attention_mask=mask)
    out["ref_norm"] = float(np.sqrt(sum(float(np.square(g.astype(np.float64)).sum()) for g in ref_grads.values())))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    batch = training._batch(model, ids, None, mask)
    _, grads = training._on_mesh(model, lambda *b: training._value_and_grad(graphdef, params, rest, *b), *batch)
    grads = opt.sum_replicated_blocks(model, grads)
    grads, params = nnx.as_pure(grads), nnx.as_pure(params)  # as nnx.Optimizer hands them to the optax chain
    out["norm"] = float(opt.global_norm(grads, opt.stored_copies(model)(params)))

    before = training.parameters(ref)
    placed = {path: v[...].sharding for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    results = {}
    for name, m in (("ref", ref), ("tp", model)):
        optimizer = training.make_optimizer(m, config)
        losses = [training.train_step(m, optimizer, config, b, attention_mask=mask) for b in batches]
        results[name] = (losses, None, training.parameters(m), optimizer)
    labels = (f"jax/tp{tp}", "jax")
    steps = compare_steps(results["tp"][:3], results["ref"][:3], before, labels, "float32", spec)  # the step table
    out["steps"] = {**steps.to_dict(), "compared": len(steps.update_rms_rel)}
    # One step where the update is linear in the clipped gradient (eps far above every |g|): make_optimizer's clipping
    # coefficient shows in the parameters (Adam's usual regime divides a common scale out).
    linear = AdamW(lr=1.0, eps=1.0, weight_decay=0.0, max_grad_norm=0.5)
    moved = {}
    for name, directory_ in (("ref", directory), ("tp", directory)) if full else ():
        m = jax_impl.from_pretrained(directory_, mesh=None if name == "ref" else tensor_parallel.make_mesh(tp))
        loss = training.train_step(m, training.make_optimizer(m, linear), linear, ids, attention_mask=mask)
        moved[name] = ([loss], None, training.parameters(m))
    if full:
        out["linear_step"] = compare_steps(moved["tp"], moved["ref"], before, labels, "float32", spec).to_dict()
    # The step keeps every parameter where the loader placed it, and Adam's moments beside them (never whole).
    out["placement_moved"] = [
        str(path)
        for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
        if not v[...].sharding.is_equivalent_to(placed[path], v[...].ndim)  # P() and P(None) are the same place
    ]
    optimizer = results["tp"][3]
    moments = [leaf for leaf in jax.tree.leaves(nnx.state(optimizer.opt_state)) if getattr(leaf, "ndim", 0) == 2]
    out["moment_specs"] = sorted({str(leaf.sharding.spec) for leaf in moments})
    # The replicas of each kv head (side by side in the global [H, copies * d] kernel) stayed identical.
    n_kv, d = spec.num_key_value_heads, spec.head_dim
    equal = []
    for layer in model.model.layers:
        for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
            kernel = np.asarray(proj.kernel[...]).reshape(spec.hidden_size, n_kv, tp // n_kv, d)
            equal.append(bool((kernel == kernel[:, :, :1]).all()))
    out["replicas_equal"] = equal
    # The compiled step: the vocabulary-parallel loss gathers no logits.
    padded = int(model.model.embed_tokens.weight[...].shape[0])
    if full:
        lower = lambda *b: training._step.lower(model, optimizer, *b).compile().as_text()  # noqa: E731
        hlo = training._on_mesh(model, lower, *batch)
        out["step_vocab_all_gathers"] = all_gathers_with_dim(hlo, padded) + all_gathers_with_dim(hlo, spec.vocab_size)
    return out


if __name__ == "__main__":
    # DEVICES, then DIRECTORY TP full|steps per configuration: all in one process (one JAX start); a mesh takes the
    # first tp of the devices.
    devices, configs = int(sys.argv[1]), [sys.argv[i : i + 3] for i in range(2, len(sys.argv), 3)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a script's path is its folder: find `tests`
    from parity.environment import prepare_environment

    prepare_environment(tp=devices)  # before JAX starts: the one place the device count is set
    print(json.dumps([main(directory, int(tp), full == "full") for directory, tp, full in configs]))
