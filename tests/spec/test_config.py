"""ModelSpec from config.json: both rope forms, head_dim, the families, and every refusal naming its key."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spec import ConfigError, ModelSpec

BASE = dict(
    model_type="qwen3",
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000,
    max_position_embeddings=40960,
    tie_word_embeddings=True,
    hidden_act="silu",
)


def make(**overrides):
    config = {**BASE, **overrides}
    return ModelSpec.from_hf_config({k: v for k, v in config.items() if v is not ...})


def test_qwen3_0_6b_shape():
    spec = make()
    assert spec.head_dim == 128 != spec.hidden_size // spec.num_attention_heads
    assert spec.qk_norm and not spec.attention_bias and spec.tie_word_embeddings
    assert spec.num_kv_groups == 2
    assert spec.rope_theta == 1e6 and spec.rope_scaling is None


def test_head_dim_defaults_to_hidden_over_heads():
    assert make(model_type="llama", head_dim=...).head_dim == 64


def test_qwen2_has_qkv_bias_and_no_qk_norm():
    spec = make(model_type="qwen2", head_dim=...)
    assert spec.attention_bias and not spec.qk_norm


def test_kv_heads_default_to_heads():
    assert make(model_type="llama", num_key_value_heads=...).num_key_value_heads == 16


def test_old_and_new_rope_forms_agree():
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    old = make(model_type="llama", rope_theta=500000.0, rope_scaling=scaling)
    new = make(model_type="llama", rope_theta=..., rope_parameters={"rope_theta": 500000.0, **scaling})
    assert old == new
    assert old.rope_scaling.rope_type == "llama3" and old.rope_theta == 500000.0
    legacy_key = make(model_type="llama", rope_scaling={"type": "linear", "factor": 2.0})
    assert legacy_key.rope_scaling.rope_type == "linear"


def test_inv_freq_matches_transformers_llama3():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, head_dim=32, rope_parameters={"rope_theta": 500000.0, **scaling}
    )
    hf_inv, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    spec = make(
        model_type="llama",
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        rope_theta=...,
        rope_parameters={"rope_theta": 500000.0, **scaling},
    )
    np.testing.assert_allclose(spec.inv_freq(), hf_inv.numpy(), rtol=1e-6)
    assert not np.allclose(spec.inv_freq(), make(head_dim=32).inv_freq())  # the scaling did something


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (dict(model_type="gpt2"), "'model_type' = 'gpt2'"),
        (dict(hidden_act="gelu"), "'hidden_act' = 'gelu'"),
        (dict(num_experts=8), "'num_experts' = 8"),
        (dict(use_sliding_window=True), "use_sliding_window"),
        (dict(model_type="mistral", sliding_window=4096), "'sliding_window' = 4096"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "'yarn'"),
        (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), "'dynamic'"),
        (dict(rope_scaling={"rope_type": "linear"}), "factor"),
        (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "low_freq_factor"),
        (dict(mlp_bias=True), "mlp_bias"),
        (dict(layer_types=["full_attention", "sliding_attention"]), "sliding_attention"),
        (dict(num_key_value_heads=5), "num_key_value_heads=5"),
        (dict(vocab_size=...), "'vocab_size'"),
        (dict(rms_norm_eps=0.0), "rms_norm_eps"),
        (dict(rms_norm_eps=..., layer_norm_eps=1e-5), "LayerNorm"),
        (dict(head_dim=..., hidden_size=1000, num_attention_heads=16), "not divisible"),
        (dict(head_dim=7), "head_dim=7"),
        (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    ],
)
def test_unsupported_configs_name_key_and_value(overrides, needle):
    with pytest.raises(ConfigError) as err:
        make(**overrides)
    assert needle in str(err.value)


def test_from_pretrained_reads_directory_and_reports_bad_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert ModelSpec.from_pretrained(tmp_path) == make()
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelSpec.from_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="no config.json"):
        ModelSpec.from_pretrained(tmp_path / "missing")


def test_round_trip_through_hf_config():
    spec = make(model_type="llama", rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert ModelSpec.from_hf_config(spec.to_hf_config()) == spec
