"""Tensor and expert parallelism of the mixture-of-experts block (torch_impl/moe.py, expert_parallel.py) on 2 and 4
gloo processes: sharded == unsharded within the float32 table (logits, routing, expert outputs, greedy tokens,
tensor-parallel gradients), each rank holding only its experts' slices.

Spawning costs seconds on a small CPU, so each layout spawns once and one worker runs every check on every rank
(`_rank_checks`) and returns plain data. Layouts: tp 2 (qwen3_moe_e6k4: a dense layer among sparse ones), ep 2
(qwen3_moe_e6k4: 3 experts per rank), tp 2 x ep 2 and ep 4 (qwen2_moe_shared: a shared expert, tied).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import torch.distributed as dist

import torch_impl
from parity.tolerances import TOLERANCES
from spec import ConfigError, InputError, ModelSpec
from tests.backends import rel_err
from tests.greedy import assert_same_greedy
from torch_impl.tp_launch import launch_logits, launched_groups, run_tp
from torch_impl.vocab_parallel import gather_logits

# A mark, not importorskip: the ranks this module spawns import it to find their function, and importing
# transformers there cost each rank ~1.5 s for nothing.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

FP32_REL = TOLERANCES["float32"].max_rel
IDS = np.array([[0, 0, 0, 5, 17, 200, 3, 9, 1], [11, 230, 1, 2, 3, 4, 100, 7, 8]])  # row 0 left-padded by MASK
MASK = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9])
PROMPTS = [[5, 17, 200, 3], [11, 230, 1, 2, 3, 4, 100]]
NEW_TOKENS = 6


def _rank_checks(path: str) -> list[dict]:
    group, ep_group = launched_groups()
    model = torch_impl.from_pretrained(path, group=group, ep_group=ep_group)
    trace: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        logits = model(IDS, attention_mask=MASK, trace=trace)
        if model.layout.tp > 1:
            logits = gather_logits(logits, model.spec.vocab_size, model.group)
    out = {
        "logits": logits.numpy(),
        "moe": {k: v.numpy() for k, v in trace.items() if ".moe." in k},
        "tokens": torch_impl.generate(model, PROMPTS, NEW_TOKENS, eos_token_ids=()).tokens,
        "experts": None if model.experts is None else list(model.experts),
        "stacks": {
            i: tuple(model.model.layers[i].mlp.experts.gate_up_proj.weight.shape) for i in model.spec.sparse_layers
        },
    }
    if model.experts is None:
        from torch_impl.training import loss_and_grads

        out["loss"], out["grads"] = loss_and_grads(model, IDS, attention_mask=MASK)
    else:
        try:
            from torch_impl.training import loss_and_grads

            loss_and_grads(model, IDS, attention_mask=MASK)
        except InputError as err:
            out["training_refused"] = str(err)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, out)
    return gathered


def _reference(path) -> dict:
    from torch_impl.training import loss_and_grads

    model = torch_impl.from_pretrained(path)
    trace: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        logits = model(IDS, attention_mask=MASK, trace=trace).numpy()
    greedy = torch_impl.generate(model, PROMPTS, NEW_TOKENS, eos_token_ids=(), return_logits=True)
    loss, grads = loss_and_grads(model, IDS, attention_mask=MASK)
    moe = {k: v.numpy() for k, v in trace.items() if ".moe." in k}
    return {
        "logits": logits,
        "moe": moe,
        "tokens": greedy.tokens,
        "greedy_logits": greedy.logits,
        "loss": loss,
        "grads": grads,
    }


@pytest.mark.parametrize(
    ("name", "tp", "ep"),
    # EP on 4 processes, and TP x EP composed (which covers EP 2 and TP 2 each); EP 2 alone runs in
    # test_launch_logits_with_expert_parallelism and tests/parity/test_tensor_parallel.py (CI time: 2 x 22 s saved)
    [("qwen2_moe_shared", 2, 2), ("qwen2_moe_shared", 1, 4)],
)
def test_sharded_matches_unsharded(name, tp, ep, hf_checkpoint):
    path = hf_checkpoint(name)
    spec = ModelSpec.from_pretrained(path)
    ranks = run_tp(_rank_checks, tp, str(path), ep=ep)
    ref = _reference(path)
    per_rank = spec.num_experts // ep
    for rank, out in enumerate(ranks):
        where = f"{name} tp={tp} ep={ep} rank {rank}"
        ep_rank = rank // tp  # rank = ep_rank * tp + tp_rank
        want = None if ep == 1 else list(range(ep_rank * per_rank, (ep_rank + 1) * per_rank))
        assert out["experts"] == want, where
        for i, shape in out["stacks"].items():
            assert shape == (per_rank, 2 * spec.moe_intermediate_size // tp, spec.hidden_size), (where, i)
        assert rel_err(out["logits"], ref["logits"]) <= FP32_REL, where
        assert set(out["moe"]) == set(ref["moe"]), where
        for key, value in ref["moe"].items():
            if key.endswith("topk_ids"):
                np.testing.assert_array_equal(out["moe"][key], value, err_msg=where)
            else:
                assert rel_err(out["moe"][key], value) <= FP32_REL, (where, key)
        print(*assert_same_greedy({"unsharded": ref["tokens"], where: out["tokens"]}, ref["greedy_logits"]))
        if ep == 1:  # tensor-parallel gradients, put together from the ranks' slices
            assert abs(out["loss"] - ref["loss"]) <= 1e-6 * ref["loss"], where
            assert set(out["grads"]) == set(ref["grads"])
            for key, grad in ref["grads"].items():
                assert rel_err(out["grads"][key], grad) <= 1e-5 * np.sqrt(3), (where, key)
        else:
            assert "expert-parallel model is not supported" in out["training_refused"], where


def test_launch_logits_with_expert_parallelism(hf_checkpoint):
    """What `check --ep N` calls: the launcher's logits equal the unsharded model's."""
    path = hf_checkpoint("qwen2_moe_shared")
    with torch.inference_mode():
        ref = torch_impl.from_pretrained(path)(IDS, attention_mask=MASK).numpy()
    assert rel_err(launch_logits(path, IDS, 1, attention_mask=MASK, ep=2).numpy(), ref) <= FP32_REL


def test_bad_expert_degree_is_refused_before_any_process_starts(hf_checkpoint, default_dir):
    with pytest.raises(ConfigError, match="does not divide num_experts=6"):
        launch_logits(hf_checkpoint("qwen3_moe_e6k4"), IDS, 1, ep=4)
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        launch_logits(default_dir, IDS, 1, ep=2)
