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
        (dict(layer_types=["full_attention"] * 27 + ["chunked_attention"]), "chunked_attention"),
        (dict(layer_types=["full_attention"] * 3), "'layer_types' has 3 entries but num_hidden_layers = 28"),
        (dict(model_type="llama", sliding_window=4096), "'sliding_window' = 4096"),
        (dict(model_type="mistral", sliding_window=9, layer_types=["full_attention"] * 28), "'layer_types'"),
        (dict(model_type="gemma3"), "gemma3_text"),
        (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
        (dict(model_type="gpt_neox", rotary_pct=1.5, layer_norm_eps=1e-5), "partial_rotary_factor"),
        (dict(model_type="gemma2", hidden_activation="relu", query_pre_attn_scalar=128), "'relu'"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "'yarn'"),
        (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), "'dynamic'"),
        (dict(rope_scaling={"rope_type": "linear"}), "factor"),
        (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "low_freq_factor"),
        (dict(mlp_bias=True), "mlp_bias"),
        (dict(layer_types=["full_attention"] * 27 + ["sliding_attention"]), "'sliding_window' is null"),
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
    padded = make(model_type="llama", pad_token_id=7)  # the embedding's padding row (tests/spec/test_pad_token.py)
    assert padded.pad_token_id == 7 and ModelSpec.from_hf_config(padded.to_hf_config()) == padded


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        # JSON true is not a number, "false" is not a boolean, NaN/Infinity are not finite.
        (dict(tie_word_embeddings="false"), "'tie_word_embeddings' must be true or false, got \"false\""),
        (dict(tie_word_embeddings=0), "'tie_word_embeddings' must be true or false, got 0"),
        (dict(attention_bias="yes"), "'attention_bias' must be true or false"),
        (dict(use_sliding_window="false"), "'use_sliding_window' must be true or false, got \"false\""),
        (dict(mlp_bias=1), "'mlp_bias' must be true or false"),
        (dict(rms_norm_eps="abc"), "'rms_norm_eps' must be a finite number > 0, got \"abc\""),
        (dict(rms_norm_eps=True), "'rms_norm_eps' must be a finite number > 0, got true"),
        (dict(rms_norm_eps=float("inf")), "'rms_norm_eps' must be a finite number > 0, got Infinity"),
        (dict(rms_norm_eps=float("nan")), "'rms_norm_eps' must be a finite number > 0, got NaN"),
        (dict(rope_theta=float("inf")), "'rope_theta' must be a finite number > 0, got Infinity"),
        (dict(rope_theta="1e6"), "'rope_theta' must be a finite number > 0"),
        (dict(rope_theta=-1.0), "'rope_theta' must be a finite number > 0, got -1.0"),
        (dict(vocab_size=True), "'vocab_size' must be an integer in [1, 2147483647], got true"),
        (dict(vocab_size=151936.0), "'vocab_size' must be an integer"),
        (dict(vocab_size=2**40), "'vocab_size' must be an integer in [1, 2147483647], got 1099511627776"),
        (dict(hidden_size="1024"), "'hidden_size' must be an integer"),
        (dict(num_hidden_layers=0), "'num_hidden_layers' must be an integer in [1,"),
        (dict(num_key_value_heads=-8), "'num_key_value_heads' must be an integer"),
        (dict(max_position_embeddings=1e9), "'max_position_embeddings' must be an integer"),
        (dict(head_dim="128"), "'head_dim' must be an integer"),
        (dict(model_type=["qwen3"]), "'model_type' must be a string"),
        (dict(hidden_act=None, num_experts="8"), "'num_experts' must be an integer in [0,"),
        (dict(layer_types=5), "'layer_types' must be a list of strings, got 5"),
        (dict(layer_types=["full_attention", 3]), "'layer_types' must be a list of strings"),
        (dict(partial_rotary_factor="1"), "'partial_rotary_factor' must be a finite number"),
        (dict(rope_scaling=[1, 2]), "'rope_scaling' must be a JSON object, got [1, 2]"),
        (dict(rope_scaling={"rope_type": "linear", "factor": float("nan")}), "'rope_scaling.factor' must be"),
        (dict(rope_scaling={"rope_type": "linear", "factor": True}), "'rope_scaling.factor' must be a finite"),
        (dict(rope_scaling={"rope_type": "linear", "factor": float("inf")}), "got Infinity"),
        (dict(rope_scaling={"rope_type": 3, "factor": 2.0}), "'rope_scaling.rope_type' must be a string"),
        (
            dict(rope_scaling={**LLAMA3, "low_freq_factor": 0, "original_max_position_embeddings": 8192}),
            "'rope_scaling.low_freq_factor' must be a finite number > 0, got 0",
        ),
        (
            dict(rope_scaling={**LLAMA3, "original_max_position_embeddings": 0}),
            "'rope_scaling.original_max_position_embeddings' must be an integer in [1,",
        ),
        (
            dict(rope_scaling={**LLAMA3, "original_max_position_embeddings": "abc"}),
            "'rope_scaling.original_max_position_embeddings' must be an integer",
        ),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": None}, rope_theta=None), None),
        (dict(rope_parameters={"rope_theta": "big"}), "'rope_parameters.rope_theta' must be a finite number"),
    ],
)
def test_every_key_read_is_typed_and_ranged(overrides, needle):
    if needle is None:  # null means absent: the default theta
        assert make(**overrides).rope_theta == 10000.0
        return
    with pytest.raises(ConfigError) as err:
        make(**overrides)
    assert needle in str(err.value)


def test_config_files_that_are_not_utf8_or_nested_too_deep(tmp_path):
    (tmp_path / "config.json").write_bytes(json.dumps(BASE).encode()[:-1] + b', "x": "\xe9"}')
    with pytest.raises(ConfigError, match=r"config.json is not UTF-8 text \(invalid byte 0xe9"):
        ModelSpec.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError, match="nested more than 64 levels deep"):
        ModelSpec.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        ModelSpec.from_pretrained(tmp_path)


def test_real_configs_with_nulls_and_unread_keys_still_parse():
    spec = make(
        model_type="qwen2",
        head_dim=None,
        num_key_value_heads=None,
        sliding_window=131072,
        use_sliding_window=False,
        max_window_layers=21,
        rope_scaling=None,
        initializer_range=float("nan"),  # a key nobody reads may hold anything
        torch_dtype="bfloat16",
    )
    assert spec.head_dim == 64 and spec.num_key_value_heads == 16


@pytest.mark.parametrize(
    ("content", "expected", "warns"),
    [
        ('{"eos_token_id": 7}', (7,), False),
        ('{"eos_token_id": [7, 9]}', (7, 9), False),
        ('{"bos_token_id": 1}', (5,), False),  # no eos here: config.json's
        ('{"eos_token_id": "eos"}', (5,), True),
        ('{"eos_token_id": [7, null]}', (5,), True),
        ('{"eos_token_id": true}', (5,), True),
        ('{"eos_token_id": -1}', (5,), True),
        ("[1, 2]", (5,), True),
        ("{not json", (5,), True),
        (b"\xff\xfe", (5,), True),
    ],
)
def test_generation_config_is_validated_or_ignored_with_a_warning(tmp_path, content, expected, warns):
    import warnings

    from spec.generation import eos_token_ids

    (tmp_path / "config.json").write_text(json.dumps({**BASE, "eos_token_id": 5}))
    path = tmp_path / "generation_config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert eos_token_ids(tmp_path) == expected
    assert bool(caught) == warns
    if warns:
        assert "ignoring" in str(caught[0].message) and "generation_config.json" in str(caught[0].message)


def test_malformed_eos_in_config_json_is_a_config_error(tmp_path):
    from spec.generation import eos_token_ids

    (tmp_path / "config.json").write_text(json.dumps({**BASE, "eos_token_id": "eos"}))
    with pytest.raises(ConfigError, match="eos_token_id must be a token id >= 0 or a list of them, got 'eos'"):
        eos_token_ids(tmp_path)
