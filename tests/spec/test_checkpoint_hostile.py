"""Hostile checkpoint directories: index entries that escape the directory, malformed weight maps, non-UTF-8
files, configs that claim absurd sizes, non-finite weights; and the valid layouts that must keep loading
(sharded, mixed dtypes, the Hugging Face cache's symlinked shards, extra rotary buffers)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading

import ml_dtypes
import numpy as np
import pytest

from spec import (
    DEFAULT_SPEC,
    Checkpoint,
    CheckpointError,
    ModelSpec,
    allow_nonfinite_weights,
    param_table,
    random_weights,
    runtime_groups,
    runtime_params,
    validate,
    validate_checkpoint,
    write_checkpoint,
)
from spec.parallel import ShardLayout
from spec.safetensors_io import write_safetensors

SPEC = DEFAULT_SPEC
INDEX = "model.safetensors.index.json"


def sharded(tmp_path):
    return write_checkpoint(tmp_path / "ckpt", SPEC, random_weights(SPEC), max_shard_bytes=40_000)


def edit_index(directory, change) -> None:
    path = directory / INDEX
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(index))


def load_all(directory, **kw):
    return list(runtime_params(Checkpoint(directory), ModelSpec.from_pretrained(directory), **kw))


@pytest.mark.parametrize("shard", ["../outside/x.safetensors", "/etc/passwd", "sub/model.safetensors", "..", ""])
def test_index_names_outside_the_directory_are_refused(tmp_path, shard):
    directory = sharded(tmp_path)
    (tmp_path / "outside").mkdir()
    first = next(iter(json.loads((directory / INDEX).read_text())["weight_map"]))
    edit_index(directory, lambda index: index["weight_map"].__setitem__(first, shard))
    with pytest.raises(CheckpointError) as err:
        Checkpoint(directory)
    assert "shard names must be strings naming files directly in the checkpoint directory" in str(err.value)
    assert json.dumps(shard) in str(err.value) and "header" not in str(err.value)  # /etc/passwd never opened


@pytest.mark.parametrize(
    ("weight_map", "needle"),
    [
        ([], 'needs a "weight_map" object'),
        (None, 'needs a "weight_map" object'),
        ({"model.norm.weight": None}, "'model.norm.weight' -> null"),
        ({"model.norm.weight": 3}, "'model.norm.weight' -> 3"),
        ({"model.norm.weight": ["a"]}, "'model.norm.weight' -> [\"a\"]"),
    ],
)
def test_weight_map_schema(tmp_path, weight_map, needle):
    directory = sharded(tmp_path)
    edit_index(directory, lambda index: index.__setitem__("weight_map", weight_map))
    with pytest.raises(CheckpointError, match="model.safetensors.index.json") as err:
        Checkpoint(directory)
    assert needle in str(err.value)


def test_index_that_is_not_an_object_or_not_utf8(tmp_path):
    directory = sharded(tmp_path)
    (directory / INDEX).write_text("[1, 2]")
    with pytest.raises(CheckpointError, match='needs a "weight_map" object'):
        Checkpoint(directory)
    (directory / INDEX).write_bytes(b'{"weight_map": {"\xff": "x"}}')
    with pytest.raises(CheckpointError, match="is not UTF-8 text"):
        Checkpoint(directory)
    (directory / INDEX).write_text("[" * 100_000)
    with pytest.raises(CheckpointError, match="nested more than 64 levels"):
        Checkpoint(directory)


def test_hugging_face_cache_layout_with_symlinked_shards_loads(tmp_path):
    """snapshots/<rev>/<shard> are symlinks to ../../blobs/<hash>: the names stay inside, the files do not."""
    source = sharded(tmp_path)
    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for k, path in enumerate(sorted(source.iterdir())):
        blob = blobs / f"{k:040x}"
        os.replace(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    assert all(p.is_symlink() for p in snapshot.iterdir())
    loaded = {(m, r): a for m, r, _, a in load_all(snapshot)}
    expected = random_weights(SPEC)
    assert np.array_equal(loaded[("model.norm", "weight")], expected["model.norm.weight"])
    assert len(loaded) == len({(e.module, e.role) for e in param_table(SPEC)})


def test_mixed_dtypes_and_extra_rotary_buffers_load(tmp_path):
    tensors = random_weights(SPEC)
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(ml_dtypes.bfloat16)
    tensors["model.layers.0.input_layernorm.weight"] = tensors["model.layers.0.input_layernorm.weight"].astype(
        np.float16
    )
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = SPEC.inv_freq()
    (tmp_path / "config.json").write_text(json.dumps(SPEC.to_hf_config()))
    write_safetensors(tmp_path / "model.safetensors", tensors)
    loaded = {(m, r): a for m, r, _, a in load_all(tmp_path, dtype=np.float32)}
    assert loaded[("model.norm", "weight")].dtype == np.float32
    assert np.array_equal(loaded[("model.norm", "weight")], tensors["model.norm.weight"].astype(np.float32))


def test_absurd_layer_count_fails_fast_with_a_short_message(tmp_path, monkeypatch):
    directory = write_checkpoint(tmp_path / "c", SPEC, random_weights(SPEC))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10**7}))
    tables = []  # the validator's calls of the real param_table: the one of 10**8 rows must never be built
    monkeypatch.setattr(validate, "param_table", lambda spec: tables.append(spec) or param_table(spec))
    with pytest.raises(CheckpointError) as err:
        Checkpoint(directory).validate(ModelSpec.from_pretrained(directory))
    assert tables == []
    assert "num_hidden_layers is 10000000 but the checkpoint holds tensors of 2 layer(s)" in str(err.value)
    assert len(str(err.value)) < 500


def test_problem_listing_is_capped_at_20_with_a_count(tmp_path):
    many = dataclasses.replace(SPEC, num_hidden_layers=8)
    directory = write_checkpoint(tmp_path / "c", many, random_weights(many))
    (directory / "config.json").write_text(json.dumps(dataclasses.replace(many, hidden_size=72).to_hf_config()))
    with pytest.raises(CheckpointError) as err:
        validate_checkpoint(Checkpoint(directory), ModelSpec.from_pretrained(directory))
    lines = str(err.value).splitlines()
    assert len(lines) == 1 + 20 + 1  # headline, 20 problems, the count
    assert lines[-1].strip().startswith("... and ") and "problems in all)" in lines[-1]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_weights_are_refused_naming_the_tensor(tmp_path, dtype, bad):
    tensors = random_weights(SPEC, dtype=dtype)
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = tensors[name].copy()
    tensors[name][7, 3] = bad
    directory = write_checkpoint(tmp_path / "c", SPEC, tensors)
    with pytest.raises(CheckpointError) as err:
        load_all(directory)
    message = str(err.value)
    assert f"tensor {name!r} holds 1 non-finite value(s)" in message and "[7, 3]" in message
    assert "--allow-nonfinite" in message
    assert len(load_all(directory, allow_nonfinite=True)) > 0  # the opt-out, as an argument
    with allow_nonfinite_weights():  # and as a scope (how the CLI reaches the loaders)
        loaded = {(m, r): a for m, r, _, a in load_all(directory)}
    assert np.isnan(loaded[("model.layers.1.mlp.gate_up_proj", "weight")].astype(np.float32)).any() == (bad != bad)
    with pytest.raises(CheckpointError):  # the scope ended: refused again
        load_all(directory)


def test_nonfinite_scan_covers_every_element_of_a_tensor_parallel_slice(tmp_path):
    """A ROW slice is a strided view (columns of the checkpoint tensor): its last element is scanned too."""
    tensors = random_weights(SPEC)
    name = "model.layers.0.mlp.down_proj.weight"  # ROW placement: columns split across ranks
    tensors[name] = tensors[name].copy()
    tensors[name][-1, -1] = np.inf
    directory = write_checkpoint(tmp_path / "c", SPEC, tensors)
    checkpoint, model_spec = Checkpoint(directory), ModelSpec.from_pretrained(directory)
    list(runtime_params(checkpoint, model_spec, layout=ShardLayout(model_spec, 2, 0)))  # rank 0: clean columns
    with pytest.raises(CheckpointError, match=name):
        list(runtime_params(checkpoint, model_spec, layout=ShardLayout(model_spec, 2, 1)))


def test_scan_ahead_raises_at_the_broken_tensor_and_stops_with_its_consumer(tmp_path):
    """The scans run ahead on a worker thread (spec/checkpoint.py): a broken tensor still raises only when the
    loader reaches it (every parameter before it yielded), and a consumer that stops early leaves no thread."""
    tensors = random_weights(SPEC)
    name = "model.layers.1.self_attn.o_proj.weight"
    tensors[name] = tensors[name].copy()
    tensors[name][0, 0] = np.nan
    directory = write_checkpoint(tmp_path / "c", SPEC, tensors)
    order = list(runtime_groups(SPEC))
    broken = order.index(("model.layers.1.self_attn.o_proj", "weight"))
    yielded = []
    with pytest.raises(CheckpointError, match=name):
        for module, role, _, _ in runtime_params(Checkpoint(directory), SPEC):
            yielded.append((module, role))
    assert yielded == order[:broken]

    stream = runtime_params(Checkpoint(directory), SPEC, allow_nonfinite=False)
    assert next(stream)[:2] == order[0]
    stream.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("nonfinite-scan")]


def test_unreadable_and_missing_files(tmp_path):
    directory = sharded(tmp_path)
    (directory / "config.json").write_bytes(b'{"model_type": "qwen3\xff"}')
    from spec import ConfigError

    with pytest.raises(ConfigError, match="config.json is not UTF-8 text"):
        ModelSpec.from_pretrained(directory)
    shard = next(directory.glob("model-00001-*.safetensors"))
    shard.unlink()
    shard.mkdir()  # a directory where a shard should be
    with pytest.raises(CheckpointError, match="which is missing"):
        Checkpoint(directory)
