"""The layer-streamed check (`check --stream`, parity/stream.py): it agrees with the whole-model check, its
teacher-forced mode localizes a bug to its layer, and it refuses bad input before any layer runs.

On a 4-layer variant of the built-in checkpoint, sharded so that every layer spans its own files, with the
head's table read in 3 blocks (spec/layerwise.py) so that block boundaries are crossed.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import parity
import spec
import spec.layerwise
import torch_impl
from parity.__main__ import main
from parity.components import component_order, residual_stream
from parity.request import validate_request
from parity.stream import _LayerProgress
from spec import CheckpointError, InputError

LAYERS = 4
MUTATED = 2  # the middle layer the layer-local mutants break
CHECK = dict(seq_len=8, batch=2)


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory) -> Path:
    model_spec = dataclasses.replace(spec.DEFAULT_SPEC, num_hidden_layers=LAYERS)
    directory = tmp_path_factory.mktemp("four_layers")
    return spec.write_checkpoint(directory, model_spec, spec.random_weights(model_spec, seed=3), max_shard_bytes=60_000)


@pytest.fixture(autouse=True)
def three_head_blocks(monkeypatch):
    """263 vocabulary rows in blocks of 100, 100 and 63: the streamed head crosses two block boundaries."""
    monkeypatch.setattr(spec.layerwise, "head_block_rows", lambda _spec: 100)


def _shard_of(directory: Path, tensor: str) -> Path:
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    return directory / index["weight_map"][tensor]


# ---- agreement with the whole-model check -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_streamed_agrees_with_whole_model_component_by_component(four_layers, dtype):
    from jax_impl.layerwise import _layer_program

    _layer_program.clear_cache()
    whole = parity.check(four_layers, dtype=dtype, stream=False, **CHECK)
    streamed = parity.check(four_layers, dtype=dtype, stream=True, **CHECK)
    assert whole.mode == "whole" and streamed.mode == "streamed"
    assert streamed.passed and whole.passed, streamed.format()
    pairs = list(zip(whole.comparisons + whole.drift, streamed.comparisons + streamed.drift, strict=True))
    assert [c.label for c, _ in pairs] == [c.label for _, c in pairs]
    noise = 1e-6 if dtype == "float32" else 4e-3  # float32: a tenth of its tolerance; bf16: one rounding (u)
    for w, s in pairs:
        assert [r.name for r in s.results] == [r.name for r in w.results] == component_order(LAYERS)
        for rw, rs in zip(w.results, s.results, strict=True):
            assert rs.passed == rw.passed and rs.bound == rw.bound
            assert abs(rs.metrics.max_rel - rw.metrics.max_rel) <= noise, (w.label, rw.name)
    # JAX compiles a decoder layer once per structure (layer 0 has no residual yet), not once per layer;
    # a float32 baseline (bf16 checks) is a second dtype, hence its own two.
    assert _layer_program._cache_size() == (2 if dtype == "float32" else 4)
    # Teacher-forced: torch is the teacher, so torch's own column is its free run; every piece agrees.
    (forced,) = streamed.teacher_forced
    assert forced.label == "torch vs jax" and streamed.forced_pieces() == []
    assert [r.name for r in forced.results] == residual_stream(LAYERS)[:-1] + ["final_norm", "logits"]
    text = streamed.format()
    header = next(line for line in text.splitlines() if line.startswith("component"))
    assert header.split()[-2:] == ["forced", "verdict"] and "every component within tolerance" in text


def test_reference_hf_streamed_uses_transformers_layers(hf_checkpoint):
    """transformers' own decoder layers, one at a time, agree with its whole model on an untied, biased Qwen2."""
    path = hf_checkpoint("qwen2_bias_untied")
    whole = parity.check(path, reference="hf", stream=False, **CHECK)
    streamed = parity.check(path, reference="hf", stream=True, **CHECK)
    assert streamed.passed, streamed.format()
    assert [c.label for c in streamed.comparisons] == ["torch vs jax", "torch vs hf", "jax vs hf"]
    assert streamed.teacher == "hf" and [c.label for c in streamed.teacher_forced] == [
        c.label for c in streamed.comparisons
    ]
    for w, s in zip(whole.comparisons[1:], streamed.comparisons[1:], strict=True):
        assert [r.name for r in s.results] == [r.name for r in w.results]
        assert all(
            abs(a.metrics.max_rel - b.metrics.max_rel) <= 1e-6 for a, b in zip(w.results, s.results, strict=True)
        )


@pytest.mark.parametrize(
    "name",
    ["mistral_window", "llama3_scaled", "olmo2_post", "gemma2_sandwich", "gemma3_local_global", "neox_parallel",
     "neox_sequential"],
)  # fmt: skip
def test_reference_hf_streamed_gives_each_layer_its_models_mask(hf_checkpoint, name):
    """Mistral's window (7) inside the 8 tokens: every layer's sliding mask, as its whole model gives them; Llama 3's
    scaled rotary and OLMo 2's post-norm layers streamed alike; Gemma 2 and 3 (windows 6 and 5) with their scaled
    embedding, alternating masks, Gemma 3's local rotary table and the logit softcap; GPT-NeoX's own layer class and
    final LayerNorm, with and without the parallel residual."""
    path = hf_checkpoint(name)
    streamed = parity.check(path, reference="hf", stream=True, **CHECK)
    assert streamed.passed, streamed.format()
    assert [c.label for c in streamed.comparisons] == ["torch vs jax", "torch vs hf", "jax vs hf"]


def test_reference_hf_streamed_refuses_the_families_it_does_not_build(hf_checkpoint):
    """A family outside FAMILIES, named (an MoE model: parity.check refuses to stream it before this is built)."""
    from parity.hf_stream import HFLayerwise

    with pytest.raises(InputError, match="covers .*, not mixtral: run --reference hf on the whole model"):
        HFLayerwise(hf_checkpoint("mixtral_e5k2"))


# ---- teacher forcing localizes --------------------------------------------------------------------------------
def _swap_gate_up_in_layer(backend: str, mp: pytest.MonkeyPatch) -> None:
    """gate_up_order_swapped (tests/parity/mutants.py), in layer MUTATED only: its checkpoint gate and up read in
    the wrong order, as a port's loader gets one layer wrong."""

    layerwise = importlib.import_module(f"{backend}_impl.layerwise")
    original = layerwise.layer_params

    def layer_params(directory, model_spec, index, dtype=None):
        for module, role, kind, array in original(directory, model_spec, index, dtype):
            if index == MUTATED and module == "mlp.gate_up_proj":
                half = array.shape[0] // 2  # [2I, H]: gate rows first
                array = np.concatenate([array[half:], array[:half]])
            yield module, role, kind, array

    mp.setattr(layerwise, "layer_params", layer_params)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_teacher_forcing_localizes_a_mutant_in_one_middle_layer(four_layers, backend):
    with pytest.MonkeyPatch.context() as mp:
        _swap_gate_up_in_layer(backend, mp)
        report = parity.check(four_layers, stream=True, **CHECK)
    assert not report.passed
    assert report.first_divergence == f"layers.{MUTATED}.mlp.gate_up"
    (free,) = report.comparisons
    failing = {r.name.split(".")[1] if r.name.startswith("layers.") else r.name for r in free.results if not r.passed}
    assert failing == {str(i) for i in range(MUTATED, LAYERS)} | {"final_norm", "logits"}  # every later piece
    assert report.forced_pieces() == [f"layers.{MUTATED}"]  # given the same input, only the broken layer differs
    assert report.forced_failures()[0].name == f"layers.{MUTATED}.x2"  # x1 is before the MLP: it agrees
    assert f"diverging pieces: layers.{MUTATED}" in report.format()
    data = json.loads(report.to_json())
    assert data["mode"] == "streamed" and data["forced_pieces"] == [f"layers.{MUTATED}"]


def test_whole_model_check_names_the_same_component_for_that_mutant(four_layers, monkeypatch):
    """The layer-local mutant in the whole model, for comparison: the same first divergence, no localization."""
    original = torch_impl.from_pretrained

    def load(*args, **kwargs):
        model = original(*args, **kwargs)
        w = model.model.layers[MUTATED].mlp.gate_up_proj.weight
        w.copy_(torch.cat([w[w.shape[0] // 2 :], w[: w.shape[0] // 2]]))
        return model

    monkeypatch.setattr(torch_impl, "from_pretrained", load)
    report = parity.check(four_layers, stream=False, **CHECK)
    assert report.first_divergence == f"layers.{MUTATED}.mlp.gate_up" and report.teacher_forced == []


# ---- bad input ------------------------------------------------------------------------------------------------
def _refuse_to_run(monkeypatch) -> None:
    import jax_impl.layerwise
    import torch_impl.layerwise

    def ran(*_args, **_kwargs):
        raise AssertionError("a piece ran before the checkpoint was validated")

    for module in (torch_impl.layerwise, jax_impl.layerwise):
        monkeypatch.setattr(module.Layerwise, "embed", ran)


def test_missing_layer_tensor_is_named_before_any_layer_runs(four_layers, tmp_path, monkeypatch):
    broken = shutil.copytree(four_layers, tmp_path / "broken")
    missing = "model.layers.3.mlp.down_proj.weight"
    shard = _shard_of(broken, missing)
    kept = spec.Checkpoint(broken)
    tensors = {n: np.array(kept.get(n)) for n in kept.names() if _shard_of(broken, n) == shard and n != missing}
    spec.safetensors_io.write_safetensors(shard, tensors)
    index_path = broken / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"][missing]
    index_path.write_text(json.dumps(index))
    _refuse_to_run(monkeypatch)
    with pytest.raises(CheckpointError, match=f"missing tensor '{missing}'"):
        parity.check(broken, stream=True, **CHECK)


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_unreadable_shard_mid_stream_fails_naming_the_file(four_layers, tmp_path, monkeypatch, capsys, damage):
    """A shard of layer 2 breaks while layer 1 streams: the check fails naming the file, with no report (exit 2)."""
    import torch_impl.layerwise

    directory = shutil.copytree(four_layers, tmp_path / "ckpt")
    shard = _shard_of(directory, f"model.layers.{MUTATED}.self_attn.q_proj.weight")
    original = torch_impl.layerwise.Layerwise.run_layer

    def run_layer(self, index, inputs, traces):
        out = original(self, index, inputs, traces)
        if index == MUTATED - 1 and shard.exists():  # the disk goes bad after layer 1 was read
            if damage == "truncated":
                shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
            else:
                shard.unlink()
        return out

    monkeypatch.setattr(torch_impl.layerwise.Layerwise, "run_layer", run_layer)
    code = main(["check", str(directory), "--stream", "--seq-len", "8"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert shard.name in err and "error" in err
    assert "PASS" not in out and "FAIL" not in out and out == ""  # no partial report presented as a result


@pytest.mark.parametrize(
    ("options", "message"), [(dict(tp=2), "--stream with --tp"), (dict(grad=True), "--stream with --grad")]
)
def test_stream_refuses_tp_and_grad(default_dir, options, message):
    with pytest.raises(InputError, match=message):
        parity.check(default_dir, stream=True, **options)


def test_cli_stream_with_tp_is_refused(default_dir, capsys):
    assert main(["check", str(default_dir), "--stream", "--tp", "2"]) == 2
    assert "--stream with --tp is not supported" in capsys.readouterr().err


# ---- automatic switch and progress -------------------------------------------------------------------------
def test_streams_on_its_own_when_the_whole_check_would_not_fit(default_dir, monkeypatch):
    import parity.memory

    lines: list[str] = []
    monkeypatch.setattr(parity.memory, "available_bytes", lambda: 1 << 20)  # 1 MiB available
    report = parity.check(default_dir, log=lines.append, progress=True, seq_len=8)
    assert report.mode == "streamed" and report.passed
    assert any("more than the 0.0 GiB available: streaming one layer at a time" in line for line in lines)
    layer_lines = [line for line in lines if line.startswith("layer ")]
    assert [line.split()[1] for line in layer_lines] == ["1/2", "2/2"]  # one line per layer off a terminal
    assert all("elapsed" in line and "left" in line and "torch" in line and "jax" in line for line in layer_lines)
    monkeypatch.setattr(parity.memory, "available_bytes", lambda: 1 << 50)  # 1 PiB: the whole-model check fits
    request = validate_request(default_dir, "float32", "reference", None, None, None, 8, None, 0, None, 1)
    assert parity.memory.should_stream(request, lines.append) is False


def test_progress_on_a_terminal_names_layer_framework_and_time_left(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stderr = Terminal()
    monkeypatch.setattr("sys.stderr", stderr)
    said: list[str] = []
    progress = _LayerProgress(4, enabled=True, say=said.append)
    progress.lane_done(0, "jax", 1.25)
    progress.piece_done(0)
    progress.close()
    assert "layer 1/4 jax: 1.2s; elapsed" in stderr.getvalue() and "left" in stderr.getvalue()
    assert said == []  # on a terminal the line is rewritten in place, not logged
    quiet = Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    silent = _LayerProgress(4, enabled=False, say=said.append)
    silent.lane_done(0, "jax", 1.0)
    silent.piece_done(0)
    silent.close()
    assert quiet.getvalue() == "" and said == []


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_layer_before_embed_is_refused_alike(default_dir, backend):
    layerwise = importlib.import_module(f"{backend}_impl.layerwise").Layerwise(default_dir)
    with pytest.raises(InputError, match=r"^run_layer before embed: a streamed forward starts with embed\(ids\), "):
        layerwise.run_layer(0, [], [])
