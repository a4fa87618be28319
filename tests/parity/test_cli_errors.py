"""Exit codes that mean what they say (issue 17): 2 for every kind of bad input, named, before any work; 3 for an
internal error in one line (the traceback only with --debug); never 1 (parity fails) for a crash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import parity.api
from parity.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_load(monkeypatch):
    """Any bad input below must be refused before a model is loaded (parity.api loads through `capture`)."""

    def loading(*args, **kwargs):
        raise AssertionError("a model was loaded: the bad input was not refused up front")

    monkeypatch.setattr(parity.api, "capture", loading)


def copy(default_dir, tmp_path) -> Path:
    return Path(shutil.copytree(default_dir, tmp_path / "ckpt"))


def edit_config(directory: Path, **changes) -> Path:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return directory


def rewrite_header(directory: Path, change) -> Path:
    """Apply `change` to the JSON header of model.safetensors (data untouched)."""
    path = directory / "model.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    text = change(header)
    blob = (text if isinstance(text, str) else json.dumps(header)).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + raw[8 + n :])
    return directory


def first_two(header: dict) -> tuple[str, str]:
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])
    return names[0], names[1]


def overlap(header):
    a, b = first_two(header)
    header[b]["data_offsets"] = [o - 4 for o in header[b]["data_offsets"]]


def float_dims(header):
    a, _ = first_two(header)
    header[a]["shape"] = [d + 0.5 for d in header[a]["shape"]]


def nested(header):
    return json.dumps(header)[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"


def escape_index(directory: Path, tmp_path: Path) -> Path:
    import spec

    shutil.rmtree(directory)
    spec.write_checkpoint(directory, spec.DEFAULT_SPEC, spec.random_weights(spec.DEFAULT_SPEC), max_shard_bytes=40_000)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "/etc/passwd"
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def nonfinite(directory: Path) -> Path:
    path = directory / "model.safetensors"
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    start = 8 + n + header["model.layers.1.self_attn.o_proj.weight"]["data_offsets"][0]
    raw[start + 40 : start + 44] = np.array(np.nan, np.float32).tobytes()  # element 10
    path.write_bytes(bytes(raw))
    return directory


BAD_CHECKPOINTS = {
    # name: (make(copy of default, tmp_path) -> directory, the message that must appear)
    "overlapping_tensors": (lambda c, t: rewrite_header(c, overlap), "overlaps"),
    "float_dims": (lambda c, t: rewrite_header(c, float_dims), "shape must be a list of JSON integers"),
    "nested_header": (lambda c, t: rewrite_header(c, nested), "nested more than 3 levels"),
    "index_escapes": (escape_index, "shard names must be strings naming files directly in the checkpoint"),
    "tie_as_string": (lambda c, t: edit_config(c, tie_word_embeddings="false"), "must be true or false"),
    "eps_infinite": (lambda c, t: edit_config(c, rms_norm_eps=float("inf")), "got Infinity"),
    # parity.api sizes the run before it validates the checkpoint: the trace of 10**7 layers is refused first
    "absurd_layers": (lambda c, t: edit_config(c, num_hidden_layers=10**7), "GiB for the traced forwards"),
    "vocab_2_40": (lambda c, t: edit_config(c, vocab_size=2**40), "'vocab_size' must be an integer in [1,"),
    "nonfinite_weight": (
        lambda c, t: nonfinite(c),
        "tensor 'model.layers.1.self_attn.o_proj.weight' holds 1 non-finite value(s) (1 NaN",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CHECKPOINTS))
def test_broken_checkpoints_exit_2_naming_the_problem(capsys, default_dir, tmp_path, case, monkeypatch):
    make, needle = BAD_CHECKPOINTS[case]
    directory = make(copy(default_dir, tmp_path), tmp_path)
    code, out, err = run(capsys, "check", str(directory), "-q")
    assert (code, needle in err, "Traceback" in err) == (2, True, False), err


def test_allow_nonfinite_loads_the_broken_checkpoint(capsys, default_dir, tmp_path):
    directory = nonfinite(copy(default_dir, tmp_path))
    code, out, err = run(capsys, "check", str(directory), "-q", "--seq-len", "4", "--allow-nonfinite")
    assert code in (0, 1), err  # it ran: NaN logits on both sides are a finding about the model, not bad input
    assert "non-finite" not in err and out.strip().splitlines()[-1].startswith(("PASS", "FAIL"))


def test_an_internal_error_exits_3_in_one_line(capsys, default_dir, monkeypatch):
    def crash(*args, **kwargs):
        return 1 / 0

    monkeypatch.setattr(parity.api, "check", crash)
    code, _, err = run(capsys, "check", str(default_dir), "-q")
    assert code == 3 and "Traceback" not in err
    assert err.strip() == (
        "decoder-parity check: internal error: ZeroDivisionError: division by zero (run with --debug for the traceback)"
    )
    for args in (["--debug", "check", str(default_dir)], ["check", str(default_dir), "--debug"]):
        code, _, err = run(capsys, *args, "-q")
        assert code == 3 and "Traceback (most recent call last)" in err and "return 1 / 0" in err


def test_interrupt_exits_130(capsys, default_dir, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(parity.api, "check", interrupted)
    assert run(capsys, "check", str(default_dir), "-q")[0] == 130


BAD_OPTIONS = {
    # name: (args after `check DIR`, message); every one refused before a model loads (the no_load fixture)
    "ids_beyond_int64": (["--ids", "99999999999999999999"], "99999999999999999999 is outside the vocabulary"),
    "ids_negative_huge": (["--ids", "1,-99999999999999999999"], "is outside the vocabulary"),
    "seed_negative": (["--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    "seed_too_large": (["--seed", str(2**70)], "argument --seed: must be <= 9223372036854775807"),
    "batch_huge": (["--batch", str(10**9)], "GiB for the traced forwards"),
    "batch_huge_prompt": (["--batch", str(10**9), "--prompt", "hi"], "GiB for the traced forwards"),
    "batch_zero": (["--batch", "0"], "argument --batch: must be >= 1, got 0"),
    "tp_zero": (["--tp", "0"], "argument --tp: must be >= 1, got 0"),
    "tp_negative": (["--tp", "-1"], "argument --tp: must be >= 1, got -1"),
    "ep_zero": (["--ep", "0"], "argument --ep: must be >= 1, got 0"),
    "ep_on_dense": (["--ep", "2"], "expert-parallel degree 2 needs a mixture-of-experts model (qwen3 is dense)"),
    "teacher_routing_on_dense": (["--teacher-forced-routing"], "--teacher-forced-routing needs a mixture-of-experts"),
    "json_parent_is_a_file": (["--json", "{d}/config.json/r.json"], "does not exist"),
    "json_is_a_directory": (["--json", "{t}"], "it is a directory"),
    "json_unwritable": (["--json", "/proc/decoder-parity.json"], "cannot write /proc/decoder-parity.json"),
    "plot_unknown_format": (["--plot", "{t}/p.txt"], "one of .png, .svg, .pdf"),
    "plot_unwritable": (["--plot", "/proc/p.png"], "cannot write /proc/p.png"),
    "steps_in_float16": (["--steps", "2", "--dtype", "float16"], "--steps in float16 compares nothing"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_bad_options_exit_2_before_any_work(capsys, default_dir, tmp_path, no_load, case):
    args, needle = BAD_OPTIONS[case]
    args = [a.format(d=default_dir, t=tmp_path) for a in args]
    code, out, err = run(capsys, "check", str(default_dir), *args, "-q")
    assert (code, "Traceback" in err) == (2, False), err
    assert needle in err, err


def test_a_corrupt_tokenizer_exits_2(capsys, default_dir, tmp_path):
    directory = copy(default_dir, tmp_path)
    (directory / "tokenizer.json").write_text('{"model": {"type": "nonsense"}}')
    code, _, err = run(capsys, "check", str(directory), "--prompt", "hi", "-q")
    assert code == 2 and "is not a valid tokenizer.json" in err


def test_unusable_cache_location_exits_2_naming_the_path(capsys, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    code, _, err = run(capsys, "check", "-q")
    assert code == 2 and f"{tmp_path / 'file' / 'decoder-parity'}" in err and "Not a directory" in err


def test_python_dash_m_exits_2_for_bad_input_and_3_never_1(default_dir):
    """The process exit status itself, as a script sees it (not just main's return value)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "parity", "check", str(default_dir), "--ids", "99999999999999999999", "-q"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
