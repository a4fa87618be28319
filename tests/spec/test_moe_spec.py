"""Mixture-of-experts in the spec: the three families' configs (real ones and transformers' defaults), every
refusal naming its key, the parameter table's stacked experts, packing, expert-parallel ranges, early checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spec import Checkpoint, CheckpointError, ConfigError, ModelSpec, param_table, random_weights, runtime_params
from spec.checkpoint import write_checkpoint
from spec.parallel import ShardLayout, check_ep_degree, expert_range
from spec.training import checkpoint_grads

# Abridged from the published config.json files (keys the spec does not read left out).
QWEN3_30B_A3B = dict(
    model_type="qwen3_moe",
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    rope_scaling=None,
    max_position_embeddings=40960,
    max_window_layers=48,
    use_sliding_window=False,
    sliding_window=None,
    attention_bias=False,
    tie_word_embeddings=False,
    hidden_act="silu",
    output_router_logits=False,
    router_aux_loss_coef=0.001,
)
QWEN15_MOE_A27B = dict(
    model_type="qwen2_moe",
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=5632,
    moe_intermediate_size=1408,
    shared_expert_intermediate_size=5632,
    num_experts=60,
    num_experts_per_tok=4,
    norm_topk_prob=False,
    decoder_sparse_step=1,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=8192,
    use_sliding_window=False,
    sliding_window=32768,
    max_window_layers=21,
    tie_word_embeddings=False,
    hidden_act="silu",
)
MIXTRAL_8X7B = dict(
    model_type="mixtral",
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=14336,
    num_local_experts=8,
    num_experts_per_tok=2,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    rope_theta=1_000_000.0,
    max_position_embeddings=32768,
    sliding_window=None,
    tie_word_embeddings=False,
    hidden_act="silu",
    router_aux_loss_coef=0.02,
)
SMALL = dict(
    model_type="qwen3_moe",
    vocab_size=61,
    hidden_size=16,
    intermediate_size=24,
    moe_intermediate_size=6,
    num_experts=6,
    num_experts_per_tok=4,
    norm_topk_prob=True,
    mlp_only_layers=[1],
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=10_000.0,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


def test_real_configs():
    qwen3 = ModelSpec.from_hf_config(QWEN3_30B_A3B)
    assert (qwen3.num_experts, qwen3.num_experts_per_tok, qwen3.moe_intermediate_size) == (128, 8, 768)
    assert qwen3.norm_topk_prob and qwen3.qk_norm and not qwen3.router_weights_float32
    assert qwen3.sparse_layers == tuple(range(48)) and qwen3.shared_expert_intermediate_size == 0
    qwen2 = ModelSpec.from_hf_config(QWEN15_MOE_A27B)
    assert qwen2.attention_bias and not qwen2.qk_norm and not qwen2.norm_topk_prob
    assert (qwen2.num_experts, qwen2.shared_expert_intermediate_size, qwen2.layer_types) == (60, 5632, ())
    mixtral = ModelSpec.from_hf_config(MIXTRAL_8X7B)
    assert mixtral.moe_intermediate_size == 14336 and mixtral.norm_topk_prob and mixtral.router_weights_float32
    assert mixtral.sliding_window is None and len(mixtral.sparse_layers) == 32


@pytest.mark.parametrize(
    ("model_type", "config_class"),
    [("qwen3_moe", "Qwen3MoeConfig"), ("qwen2_moe", "Qwen2MoeConfig"), ("mixtral", "MixtralConfig")],
)
def test_defaults_are_transformers_defaults(model_type, config_class):
    """A config that leaves the MoE keys out reads as transformers' config class fills them in."""
    transformers = pytest.importorskip("transformers")
    sizes = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    ours = ModelSpec.from_hf_config(dict(sizes, model_type=model_type, rms_norm_eps=1e-6, max_position_embeddings=64))
    theirs = getattr(transformers, config_class)(**sizes)
    experts = getattr(theirs, "num_experts", None) or theirs.num_local_experts
    assert ours.num_experts == experts and ours.num_experts_per_tok == theirs.num_experts_per_tok
    if model_type == "mixtral":
        assert ours.moe_intermediate_size == theirs.intermediate_size and ours.norm_topk_prob
    else:
        assert ours.moe_intermediate_size == theirs.moe_intermediate_size
        assert ours.norm_topk_prob == theirs.norm_topk_prob
        assert ours.decoder_sparse_step == theirs.decoder_sparse_step
        assert list(ours.mlp_only_layers) == list(theirs.mlp_only_layers)
    if model_type == "qwen2_moe":
        assert ours.shared_expert_intermediate_size == theirs.shared_expert_intermediate_size


@pytest.mark.parametrize("config", [QWEN3_30B_A3B, QWEN15_MOE_A27B, MIXTRAL_8X7B, SMALL])
def test_round_trip_and_transformers_reads_our_config(config):
    transformers = pytest.importorskip("transformers")
    spec = ModelSpec.from_hf_config(config)
    written = spec.to_hf_config()
    assert ModelSpec.from_hf_config(written) == spec
    theirs = transformers.AutoConfig.for_model(**written)
    assert (getattr(theirs, "num_experts", None) or theirs.num_local_experts) == spec.num_experts
    assert theirs.num_experts_per_tok == spec.num_experts_per_tok


def test_sparse_layers_follow_step_and_mlp_only_layers():
    spec = ModelSpec.from_hf_config(dict(SMALL, num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3]))
    assert spec.sparse_layers == (1, 5)  # (i + 1) % 2 == 0, minus layer 3


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (dict(num_experts_per_tok=7), "'num_experts_per_tok' = 7 must be in [1, num_experts = 6]"),
        (dict(mlp_only_layers=[3]), "'mlp_only_layers' = [3]"),
        (dict(mlp_only_layers=[1, 1]), "distinct"),
        (dict(mlp_only_layers=[-1]), "'mlp_only_layers' must be a list of integers"),
        (dict(mlp_only_layers=5), "'mlp_only_layers' must be a list of integers"),
        (dict(num_experts=True), "'num_experts' must be an integer"),
        (dict(num_experts="8"), "'num_experts' must be an integer"),
        (dict(decoder_sparse_step=0), "'decoder_sparse_step'"),
        (dict(norm_topk_prob="true"), "'norm_topk_prob' must be true or false"),
        (dict(router_jitter_noise=0.1), "'router_jitter_noise' = 0.1"),
        (dict(shared_expert_intermediate_size=8), "'shared_expert_intermediate_size' = 8"),
        (dict(model_type="qwen2_moe", qkv_bias=False), "'qkv_bias' = False"),
        (dict(model_type="qwen3", num_experts=8), "'num_experts' = 8: mixture-of-experts is not supported"),
        (dict(model_type="mixtral", mlp_bias=True), "mlp_bias"),
    ],
)
def test_refusals_name_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        ModelSpec.from_hf_config({**SMALL, **overrides})
    assert needle in str(err.value)


def test_dense_spec_with_moe_sizes_is_refused():
    dense = ModelSpec.from_hf_config(dict(SMALL, model_type="qwen3", num_experts=None, moe_intermediate_size=None))
    with pytest.raises(ConfigError, match="num_experts = 0"):
        dataclasses.replace(dense, num_experts_per_tok=2)


def test_parameter_table_stacks_experts():
    spec = ModelSpec.from_hf_config(SMALL)
    table = {e.name: e for e in param_table(spec)}
    e5 = table["model.layers.2.mlp.experts.5.up_proj.weight"]
    assert (e5.module, e5.expert, e5.part, e5.shape) == ("model.layers.2.mlp.experts.gate_up_proj", 5, 1, (6, 16))
    assert table["model.layers.0.mlp.gate.weight"].shape == (6, 16)
    assert "model.layers.1.mlp.gate_proj.weight" in table  # layer 1 is dense (mlp_only_layers)
    assert not any(n.startswith("model.layers.1.mlp.experts") for n in table)
    mixtral = ModelSpec.from_hf_config(dict(MIXTRAL_8X7B, hidden_size=16, num_attention_heads=2, num_key_value_heads=1))
    names = {e.name for e in param_table(mixtral)}
    assert {f"model.layers.0.block_sparse_moe.experts.7.{w}.weight" for w in ("w1", "w2", "w3")} <= names


def test_packing_and_gradient_split_are_inverse(tmp_path):
    spec = ModelSpec.from_hf_config(SMALL)
    tensors = random_weights(spec, seed=3)
    write_checkpoint(tmp_path, spec, tensors)
    packed = {(m, r): a for m, r, _, a in runtime_params(Checkpoint(tmp_path), spec)}
    gate_up = packed[("model.layers.2.mlp.experts.gate_up_proj", "weight")]  # [E, 2 * Im, H]
    assert gate_up.shape == (6, 12, 16)
    np.testing.assert_array_equal(gate_up[4, :6], tensors["model.layers.2.mlp.experts.4.gate_proj.weight"])
    np.testing.assert_array_equal(gate_up[4, 6:], tensors["model.layers.2.mlp.experts.4.up_proj.weight"])
    back = checkpoint_grads(spec, packed)
    assert back.keys() == tensors.keys()
    for name, array in tensors.items():
        np.testing.assert_array_equal(back[name], array, err_msg=name)


def test_expert_parallel_ranges(tmp_path):
    spec = ModelSpec.from_hf_config(SMALL)
    assert [expert_range(spec, 2, r) for r in range(2)] == [range(0, 3), range(3, 6)]
    with pytest.raises(ConfigError, match="does not divide num_experts=6"):
        check_ep_degree(spec, 4)
    dense = ModelSpec.from_hf_config(dict(SMALL, model_type="qwen3", num_experts=None, moe_intermediate_size=None))
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        check_ep_degree(dense, 2)
    with pytest.raises(ConfigError, match="does not divide moe_intermediate_size=6"):
        ShardLayout(spec, 4)
    write_checkpoint(tmp_path, spec, random_weights(spec))
    local = {(m, r): a for m, r, _, a in runtime_params(Checkpoint(tmp_path), spec, experts=expert_range(spec, 2, 1))}
    whole = {(m, r): a for m, r, _, a in runtime_params(Checkpoint(tmp_path), spec)}
    key = ("model.layers.0.mlp.experts.down_proj", "weight")
    np.testing.assert_array_equal(local[key], whole[key][3:])
    np.testing.assert_array_equal(
        local[("model.layers.0.mlp.router", "weight")], whole[("model.layers.0.mlp.router", "weight")]
    )


def test_a_config_claiming_a_million_experts_fails_fast(tmp_path):
    spec = ModelSpec.from_hf_config(SMALL)
    write_checkpoint(tmp_path, spec, random_weights(spec))
    huge = dataclasses.replace(spec, num_experts=10**6)
    with pytest.raises(CheckpointError, match="num_experts is 1000000 but the checkpoint holds tensors of 6 expert"):
        Checkpoint(tmp_path).validate(huge)


@pytest.mark.parametrize(
    ("routing", "needle"),
    [
        ({1: [[[0, 1, 2, 3]] * 3]}, "routing given for layer 1, which is not a sparse layer (0, 2)"),
        ({True: [[[0, 1, 2, 3]] * 3]}, "routing given for layer True"),
        ({0: [[[0.0, 1.0, 2.0, 3.0]] * 3]}, "got dtype float64"),
        ({0: [[[0, 1, 2, 3]] * 2]}, "expert ids of shape [1, 2, 4], expected [1, 3, 4]"),
        ({0: [[[0, 1, 2, 6]] * 3]}, "expert id 6 at [0, 0, 3] is outside [0, 6)"),
        ({0: [[[0, 1, 2, -1]] * 3]}, "expert id -1 at [0, 0, 3]"),
        ({0: [[[0, 1, 2, 3], [0, 1, 2, 3], [4, 1, 4, 3]]]}, "expert 4 appears twice for token [0, 2]"),
        ([[[0, 1, 2, 3]]], "routing must be a dict"),
    ],
)
def test_teacher_forced_routing_is_checked_once_for_both_backends(routing, needle):
    from spec import InputError
    from spec.inputs import check_routing

    spec = ModelSpec.from_hf_config(SMALL)
    with pytest.raises(InputError) as err:
        check_routing(routing, spec, 1, 3)
    assert needle in str(err.value)
    ok = check_routing({0: np.array([[[5, 0, 1, 2]] * 3], np.uint8)}, spec, 1, 3)
    assert ok[0].dtype == np.int64 and ok[0][0, 0].tolist() == [5, 0, 1, 2]
