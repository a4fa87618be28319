"""ModelSpec.pad_token_id, the embedding's padding row (spec/families.py, PADDING_ROW_DEFAULTS): read with each
family's transformers default, only where transformers' embedding takes padding_idx, written back by
to_hf_config, and refused by name when it is not an id of the vocabulary."""

from __future__ import annotations

import dataclasses

import pytest

from spec import ConfigError, ModelSpec
from spec.families import FAMILIES, PADDING_ROW_DEFAULTS
from spec.parallel import ShardLayout
from tests.hf_configs import ALL_CONFIGS
from tests.hf_models import build_hf_model

# one transformers-built config per family (tests/hf_models.py), as its config class writes config.json
NAMES = {c["model_type"]: name for name, c in reversed(ALL_CONFIGS.items())}
BASE = dict(
    model_type="gemma2",
    vocab_size=307,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=12,
    rms_norm_eps=1e-6,
    query_pre_attn_scalar=12,
    max_position_embeddings=256,
)


def written(name: str, **overrides) -> dict:
    """The config.json transformers writes for ALL_CONFIGS[name] (every key, defaults included)."""
    config = build_hf_model(name).config.to_dict()
    return {**config, **overrides}


def test_every_family_has_a_rule():
    assert set(PADDING_ROW_DEFAULTS) == set(FAMILIES) - {"gpt_neox"}
    assert set(NAMES) == set(FAMILIES)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_default_is_the_config_class_default_where_the_embedding_has_padding_idx(model_type):
    """Key omitted -> transformers' config-class default, and that is the padding_idx its model builds."""
    transformers = pytest.importorskip("transformers")
    config = written(NAMES[model_type])
    del config["pad_token_id"]
    ours = ModelSpec.from_hf_config(config).pad_token_id
    theirs = transformers.AutoConfig.for_model(**config)
    padding_idx = build_hf_model(NAMES[model_type]).get_input_embeddings().padding_idx
    if model_type == "gpt_neox":  # embed_in = nn.Embedding(vocab, hidden): no padding row
        assert ours is None and padding_idx is None
    else:
        assert ours == PADDING_ROW_DEFAULTS[model_type] == theirs.pad_token_id == padding_idx


@pytest.mark.parametrize("model_type", FAMILIES)
def test_an_explicit_id_is_the_models_padding_idx(model_type):
    transformers = pytest.importorskip("transformers")
    config = written(NAMES[model_type], pad_token_id=7)
    model = getattr(transformers, type(build_hf_model(NAMES[model_type])).__name__)
    padding_idx = model(transformers.AutoConfig.for_model(**config)).get_input_embeddings().padding_idx
    assert ModelSpec.from_hf_config(config).pad_token_id == padding_idx == (None if model_type == "gpt_neox" else 7)


def test_null_means_no_padding_row_even_where_the_default_is_an_id():
    assert ModelSpec.from_hf_config(BASE).pad_token_id == 0  # Gemma 2's default
    assert ModelSpec.from_hf_config({**BASE, "pad_token_id": None}).pad_token_id is None
    assert ModelSpec.from_hf_config({**BASE, "model_type": "olmo2"}).pad_token_id == 1


@pytest.mark.parametrize("pad", [None, 0, 5, 306, "default"])
@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text", "olmo2", "llama", "qwen3", "mistral"])
def test_round_trip_through_hf_config(model_type, pad):
    config = {**BASE, "model_type": model_type}
    if pad != "default":
        config["pad_token_id"] = pad
    model_spec = ModelSpec.from_hf_config(config)
    written_config = model_spec.to_hf_config()
    assert written_config["pad_token_id"] == model_spec.pad_token_id  # null written as null, not left out
    assert ModelSpec.from_hf_config(written_config) == model_spec


@pytest.mark.parametrize("model_type", sorted(set(NAMES) - {"gpt_neox"}))
def test_transformers_reads_our_written_pad_token_id(model_type):
    transformers = pytest.importorskip("transformers")
    model_spec = dataclasses.replace(ModelSpec.from_hf_config(written(NAMES[model_type])), pad_token_id=3)
    for pad in (3, None):
        config = dataclasses.replace(model_spec, pad_token_id=pad).to_hf_config()
        assert transformers.AutoConfig.for_model(**config).pad_token_id == pad


def test_gpt_neox_ignores_the_key_and_refuses_the_field():
    config = written("neox_parallel", pad_token_id=5)
    model_spec = ModelSpec.from_hf_config(config)
    assert model_spec.pad_token_id is None and "pad_token_id" not in model_spec.to_hf_config()
    with pytest.raises(ConfigError, match="pad_token_id = 5 but a gpt_neox embedding has no padding row"):
        dataclasses.replace(model_spec, pad_token_id=5)


@pytest.mark.parametrize(
    ("pad", "needle"),
    [
        (True, "'pad_token_id' must be an integer in [-2147483647, 2147483647], got true"),
        (False, "'pad_token_id' must be an integer in [-2147483647, 2147483647], got false"),
        (1.0, "'pad_token_id' must be an integer in [-2147483647, 2147483647], got 1.0"),
        ("0", "'pad_token_id' must be an integer in [-2147483647, 2147483647], got \"0\""),
        (-308, "'pad_token_id' = -308 must be an id in [-307, vocab_size = 307) or null"),
        (2**40, "'pad_token_id' must be an integer in [-2147483647, 2147483647], got 1099511627776"),
        (307, "'pad_token_id' = 307 must be an id in [-307, vocab_size = 307) or null"),
        (100_000, "'pad_token_id' = 100000 must be an id in [-307, vocab_size = 307) or null"),
    ],
)
def test_bad_pad_token_id_names_key_and_value(pad, needle):
    for model_type in ("gemma2", "llama"):
        with pytest.raises(ConfigError) as err:
            ModelSpec.from_hf_config({**BASE, "model_type": model_type, "pad_token_id": pad})
        assert needle in str(err.value)


def test_negative_id_counts_from_the_end_as_nn_embedding_does():
    """Old Llama configs write pad_token_id -1: transformers' nn.Embedding(padding_idx=-1) pads the last row."""
    import torch

    model_spec = ModelSpec.from_hf_config({**BASE, "pad_token_id": -1})
    assert model_spec.pad_token_id == 306 == torch.nn.Embedding(307, 4, padding_idx=-1).padding_idx


@pytest.mark.parametrize("pad", [True, 2.0, "3", -2])
def test_direct_construction_refuses_a_bad_field(pad):
    with pytest.raises(ConfigError, match="'pad_token_id' must be an integer in"):
        dataclasses.replace(ModelSpec.from_hf_config(BASE), pad_token_id=pad)


def test_a_shards_spec_keeps_the_global_id():
    """A rank's local_spec has vocab_size = its shard; the id stays global (the backends offset it)."""
    model_spec = ModelSpec.from_hf_config({**BASE, "pad_token_id": 300})
    for rank in (0, 1):
        local = ShardLayout(model_spec, 2, rank).local_spec
        assert local.vocab_size == 154 and local.pad_token_id == 300
    assert ShardLayout(model_spec, 2).global_spec.pad_token_id == 300
