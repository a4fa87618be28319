"""Checkpoint reading, writing and validation: round trips, shards, and every broken-file error."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from spec import DEFAULT_SPEC, Checkpoint, CheckpointError, ModelSpec, random_weights, runtime_params, write_checkpoint
from spec.default import default_checkpoint
from spec.params import param_table, parameter_count

SPEC = DEFAULT_SPEC


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_round_trip_each_dtype(tmp_path, dtype):
    tensors = random_weights(SPEC, seed=3, dtype=dtype)
    write_checkpoint(tmp_path, SPEC, tensors)
    checkpoint = Checkpoint(tmp_path)
    assert set(checkpoint.names()) == set(tensors)
    for name, array in tensors.items():
        loaded = checkpoint.get(name)
        assert loaded.dtype == array.dtype and loaded.shape == array.shape
        assert np.array_equal(loaded.view(np.uint8), array.view(np.uint8))  # bit-exact
    assert ModelSpec.from_pretrained(tmp_path) == SPEC


def test_sharded_round_trip(tmp_path):
    tensors = random_weights(SPEC, seed=1)
    write_checkpoint(tmp_path, SPEC, tensors, max_shard_bytes=40_000)
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").is_file()
    checkpoint = Checkpoint(tmp_path)
    for name, array in tensors.items():
        assert np.array_equal(checkpoint.get(name), array)


def test_runtime_params_pack_gate_first(tmp_path):
    tensors = random_weights(SPEC, seed=2)
    write_checkpoint(tmp_path, SPEC, tensors)
    packed = {(m, r): a for m, r, _, a in runtime_params(Checkpoint(tmp_path), SPEC)}
    gate_up = packed[("model.layers.1.mlp.gate_up_proj", "weight")]
    i = SPEC.intermediate_size
    assert gate_up.shape == (2 * i, SPEC.hidden_size)
    assert np.array_equal(gate_up[:i], tensors["model.layers.1.mlp.gate_proj.weight"])
    assert np.array_equal(gate_up[i:], tensors["model.layers.1.mlp.up_proj.weight"])
    assert ("lm_head", "weight") not in packed  # tied: the head is the embedding


def test_parameter_count_counts_tied_head_once():
    h, i, v, L = SPEC.hidden_size, SPEC.intermediate_size, SPEC.vocab_size, SPEC.num_hidden_layers
    q, kv = SPEC.num_attention_heads * SPEC.head_dim, SPEC.num_key_value_heads * SPEC.head_dim
    per_layer = 2 * h + h * q + 2 * h * kv + q * h + 2 * SPEC.head_dim + 3 * h * i
    assert parameter_count(SPEC) == v * h + L * per_layer + h


def broken(tmp_path, mutate):
    tensors = random_weights(SPEC, seed=0)
    mutate(tensors)
    from spec.safetensors_io import write_safetensors

    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(SPEC.to_hf_config()))
    write_safetensors(tmp_path / "model.safetensors", tensors)
    return tmp_path


def load_all(directory):
    return list(runtime_params(Checkpoint(directory), ModelSpec.from_pretrained(directory)))


def test_validation_lists_every_problem_in_one_error(tmp_path):
    def mutate(t):
        del t["model.layers.0.self_attn.q_proj.weight"]
        t["model.layers.0.extra.weight"] = np.zeros(3, np.float32)
        t["model.layers.1.mlp.down_proj.weight"] = np.zeros((5, 7), np.float32)
        t["model.embed_tokens.weight"] = np.zeros((SPEC.vocab_size + 1, SPEC.hidden_size), np.float32)

    with pytest.raises(CheckpointError) as err:
        load_all(broken(tmp_path, mutate))
    message = str(err.value)
    assert "missing tensor 'model.layers.0.self_attn.q_proj.weight'" in message
    assert "unexpected tensor 'model.layers.0.extra.weight'" in message
    assert "'model.layers.1.mlp.down_proj.weight' has shape [5, 7], expected [64, 176]" in message
    assert f"has {SPEC.vocab_size + 1} rows but vocab_size is {SPEC.vocab_size}" in message


def test_tied_head_present_and_equal_is_accepted(tmp_path):
    directory = broken(tmp_path, lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"].copy()))
    modules = [m for m, *_ in load_all(directory)]
    assert "lm_head" not in modules


def test_tied_head_present_and_different_is_refused(tmp_path):
    directory = broken(tmp_path, lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"] * 1.5))
    with pytest.raises(CheckpointError, match="not really tied"):
        load_all(directory)


def test_truncated_file_names_the_file(tmp_path):
    write_checkpoint(tmp_path, SPEC, random_weights(SPEC))
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated"):
        load_all(tmp_path)
    path.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="model.safetensors: truncated"):
        Checkpoint(tmp_path)


def test_corrupt_header_names_the_file(tmp_path):
    write_checkpoint(tmp_path, SPEC, random_weights(SPEC))
    path = tmp_path / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:12] = b"\xff\xfe{{"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors: corrupt header"):
        Checkpoint(tmp_path)


def test_pickled_checkpoints_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SPEC.to_hf_config()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(CheckpointError, match="pickled weights .*pytorch_model.bin.* execute arbitrary code"):
        Checkpoint(tmp_path)


def test_missing_directory_and_missing_shard(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        Checkpoint(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{}")  # a file given where the directory belongs: named as such
    with pytest.raises(CheckpointError, match="config.json is a file, not the checkpoint's directory"):
        Checkpoint(tmp_path / "config.json")
    write_checkpoint(tmp_path, SPEC, random_weights(SPEC), max_shard_bytes=40_000)
    next(tmp_path.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="shard 'model-00002-of-.*missing"):
        Checkpoint(tmp_path)


def test_default_checkpoint_is_deterministic_and_cached(tmp_path):
    first = default_checkpoint(tmp_path / "a")
    second = default_checkpoint(tmp_path / "b")
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    assert default_checkpoint(tmp_path / "a") == first
    spec = ModelSpec.from_pretrained(first)
    assert spec.tie_word_embeddings and spec.num_kv_groups == 2 and spec.head_dim != spec.hidden_size // 4
    assert {e.name for e in param_table(spec)} == set(Checkpoint(first).names())
    assert not list((tmp_path / "a").glob(".*tmp*"))  # nothing half-written left behind
