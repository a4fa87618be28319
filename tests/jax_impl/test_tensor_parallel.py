"""Tensor parallelism on simulated CPU devices: sharded logits and greedy tokens equal unsharded ones,
no full-vocabulary all-gather in the compiled greedy step, one tied table per shard, clear errors."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import spec
from spec import ConfigError
from tests.specs import QWEN2_SINGLE_KV

SCRIPT = Path(__file__).with_name("tp_script.py")
TRAIN_SCRIPT = Path(__file__).with_name("tp_train_script.py")
FP32_REL = 1e-5  # float32 tolerance of the decoder; sharding only reorders the all-reduced sums
GRAD_REL = 1e-5 * 3**0.5  # the float32 gradient table at L = 2 (parity/tolerances.py: GRAD_TOLERANCES)


@pytest.fixture(scope="module")
def qwen2_untied(tmp_path_factory):
    """Untied, q/k/v bias, 4 kv heads (split, not replicated), odd vocabulary."""
    qwen2 = dataclasses.replace(
        spec.DEFAULT_SPEC, model_type="qwen2", vocab_size=199, num_key_value_heads=4, head_dim=16,
        tie_word_embeddings=False, attention_bias=True, qk_norm=False,
    )  # fmt: skip
    directory = tmp_path_factory.mktemp("qwen2_untied")
    return spec.write_checkpoint(directory, qwen2, spec.random_weights(qwen2, seed=5))


def _run(script: Path, *args) -> list[dict]:
    result = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# (tp, dp) meshes of the default checkpoint, all in one process of 4 devices (a 2-device mesh takes the first two)
DEFAULT_MESHES = ((2, 1), (4, 1), (2, 2))


def test_checkpoints_sharded(default_dir, qwen2_untied):
    """The default checkpoint at tp 2, tp 4 and tp 2 x dp 2, and the untied q/k/v-bias one at tp 4: one process."""
    configs = [(default_dir, tp, dp) for tp, dp in DEFAULT_MESHES] + [(qwen2_untied, 4, 1)]
    runs = _run(SCRIPT, 4, *(arg for config in configs for arg in config))
    for (directory, tp, dp), out in zip(configs, runs, strict=True):
        where = f"{directory.name} tp {tp} dp {dp}"
        assert out["rel_err"] <= FP32_REL, where
        assert out["greedy_identical"] is True, (where, out["greedy_identical"])
        assert out["logits_spec"].endswith("'model')"), where  # logits stay vocabulary-sharded
        assert out["vocab_all_gathers"] == [], (where, out["vocab_all_gathers"])
        assert out["control_gathers"], "the all-gather detector must see a deliberate full-vocabulary gather"
        assert out["has_all_reduce"], where  # row-parallel projections really are reduced across devices
        assert out["kv_heads_as_torch_ranks"] and all(out["kv_heads_as_torch_ranks"]), where
        assert out["gathered_spec"] in ("P()", "PartitionSpec()"), where  # gather_logits: whole logits everywhere
        assert out["grad_vocab_all_gathers"] == [], (where, out["grad_vocab_all_gathers"])  # the loss gathers none
        assert out["grad_loss_rel"] <= 1e-6 and out["grad_rel_err"] <= GRAD_REL, where
        if directory == default_dir:  # V=263 padded to 264, one shard each; kv heads split at tp 2, replicated at 4
            assert out["vocab_padded"] == 264 and out["table_shard_rows"] == [264 // tp], where
            assert out["tied_no_head"], where  # the tied head is the embedding shard itself
        else:
            assert not out["tied_no_head"], where


def test_sharded_train_steps_match_unsharded(default_dir, tmp_path):
    """train_step on a mesh: the replicated kv heads' gradient summed over their copies, the clipping norm with
    each element once, AdamW beside every shard; after the steps the parameters agree with the unsharded model's
    within the step table, the replicas stay identical, nothing moved, and the compiled step gathers no logits.
    The default checkpoint at tp 4 (2 kv heads, each on 2 devices) and a single-kv-head Qwen2 at tp 2."""
    qwen2 = spec.write_checkpoint(tmp_path, QWEN2_SINGLE_KV, spec.random_weights(QWEN2_SINGLE_KV, 1))
    configs = ((default_dir, 4, "full"), (qwen2, 2, "steps"))
    runs = _run(TRAIN_SCRIPT, 4, *(arg for config in configs for arg in config))  # one process of 4 devices
    for (_, tp, full), out in zip(configs, runs, strict=True):
        assert abs(out["norm"] - out["ref_norm"]) <= 1e-6 * out["ref_norm"], (tp, out["norm"], out["ref_norm"])
        assert out["ref_norm"] > 0.5  # the steps clip (max_grad_norm 0.5)
        steps = out["steps"]
        assert steps["test_losses"] == pytest.approx(steps["ref_losses"], rel=1e-6)
        assert steps["passed"] and steps["compared"] > 20, steps
        assert out["replicas_equal"] and all(out["replicas_equal"]), out["replicas_equal"]
        assert out["placement_moved"] == [], out["placement_moved"]
        assert "P(None, 'model')" in out["moment_specs"]  # Adam's moments sharded like the kernels, never whole
        if full == "full":
            assert out["linear_step"]["passed"], out["linear_step"]
            assert out["step_vocab_all_gathers"] == [], out["step_vocab_all_gathers"]


@pytest.mark.parametrize(
    ("tp", "needle"),
    [
        (3, "degree 3 does not fit this model: it does not divide num_attention_heads=4"),
        (8, "degree 8 does not fit this model: it does not divide num_attention_heads=4"),
        (0, "must be a positive integer"),
    ],
)
def test_bad_degree_is_refused(tp, needle):
    from spec.parallel import check_tp_degree

    with pytest.raises(ConfigError) as err:
        check_tp_degree(spec.DEFAULT_SPEC, tp)
    assert needle in str(err.value)


def test_kv_heads_and_intermediate_must_divide():
    from spec.parallel import check_tp_degree

    odd = dataclasses.replace(spec.DEFAULT_SPEC, num_attention_heads=12, num_key_value_heads=3, intermediate_size=170)
    with pytest.raises(ConfigError) as err:
        check_tp_degree(odd, 4)
    assert "num_key_value_heads=3" in str(err.value) and "intermediate_size=170" in str(err.value)


def test_mesh_larger_than_devices_is_refused():
    from jax_impl.tensor_parallel import make_mesh

    with pytest.raises(ConfigError, match=r"prepare_environment\(tp=64\)"):
        make_mesh(64)
