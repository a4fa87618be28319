"""`decoder-parity check`: output, --json, --plot, exit codes 0/1/2, and a message for every bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torch_impl
from parity.__main__ import main
from tests.parity.mutant_patches import causal_mask_off_by_one
from tests.parity.test_check import HAS_FUSED

REPO = Path(__file__).resolve().parents[2]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_passes_and_writes_json_and_plot(capsys, default_dir, tmp_path):
    report_path, plot_path = tmp_path / "report.json", tmp_path / "residual.png"
    code, out, err = run(
        capsys,
        str(default_dir),
        "--dtype",
        "bfloat16",
        "--seq-len",
        "8",
        "--json",
        str(report_path),
        "--plot",
        str(plot_path),
    )
    assert code == 0, out + err
    assert "layers.1.mlp.act" in out and "torch~f32" in out  # the table, with the float32 drift columns
    assert out.strip().splitlines()[-1].startswith("PASS (bfloat16")
    assert "loading" in err  # progress and stage lines go to stderr
    data = json.loads(report_path.read_text())
    assert data["passed"] is True and data["dtype"] == "bfloat16" and data["input_shape"] == [1, 8]
    assert len(data["comparisons"][0]["components"]) == 23 and len(data["drift"]) == 2
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_a_directory_the_default_checkpoint_is_used(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the built-in default is written there on first use
    code, out, _ = run(capsys, "--seq-len", "4", "-q")
    assert code == 0 and str(tmp_path) in out


def test_a_divergence_exits_1_and_names_the_component(capsys, default_dir, monkeypatch):
    monkeypatch.setattr(torch_impl.model, "causal_mask", causal_mask_off_by_one)
    code, out, _ = run(capsys, str(default_dir), "--seq-len", "8", "-q")
    assert code == 1
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("FAIL") and "first divergence at layers.0.attn_out (torch vs jax)" in verdict
    assert "FAIL <- first" in out


def _copy(default_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(default_dir, tmp_path / "ckpt"))


def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _truncate(directory: Path) -> None:
    path = directory / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])


BAD_INPUTS = {
    # name: (setup(default_dir, tmp_path) -> args, the message that must appear)
    "missing_directory": (lambda d, t: [str(t / "nope")], "does not exist"),
    "file_not_directory": (lambda d, t: [str(d / "config.json")], "is not a directory"),
    "unsupported_model_type": (
        lambda d, t: (_edit_config(c := _copy(d, t), model_type="gpt2"), [str(c)])[1],
        "'model_type' = 'gpt2' is not supported",
    ),
    "unsupported_activation": (
        lambda d, t: (_edit_config(c := _copy(d, t), hidden_act="gelu"), [str(c)])[1],
        "'hidden_act' = 'gelu'",
    ),
    "no_config": (lambda d, t: ((c := _copy(d, t)) / "config.json").unlink() or [str(c)], "no config.json"),
    "truncated_weights": (lambda d, t: (_truncate(c := _copy(d, t)), [str(c)])[1], "truncated"),
    "shape_mismatch": (lambda d, t: (_edit_config(c := _copy(d, t), intermediate_size=100), [str(c)])[1], "has shape"),
    "ids_out_of_vocabulary": (lambda d, t: [str(d), "--ids", "1,2,999"], "999 is outside the vocabulary [0, 263)"),
    "ids_not_integers": (lambda d, t: [str(d), "--ids", "1,a,3"], "not a list of integers"),
    "ids_ragged": (lambda d, t: [str(d), "--ids", "1,2;3"], "different lengths"),
    "ids_with_seq_len": (lambda d, t: [str(d), "--ids", "1,2", "--seq-len", "4"], "do not apply with --ids"),
    "seq_len_beyond_positions": (
        lambda d, t: [str(d), "--seq-len", "600"],
        "--seq-len 600 exceeds the model's max_position_embeddings (512)",
    ),
    "seq_len_zero": (lambda d, t: [str(d), "--seq-len", "0"], "must be >= 1"),
    "dtype_not_supported": (lambda d, t: [str(d), "--dtype", "int8"], "invalid choice: 'int8'"),
    "kernels_not_supported": (lambda d, t: [str(d), "--kernels", "cuda"], "invalid choice: 'cuda'"),
    "prompt_without_tokenizer": (
        lambda d, t: ((c := _copy(d, t)) / "tokenizer.json").unlink() or [str(c), "--prompt", "hi"],
        "has no tokenizer.json",
    ),
    "json_into_missing_directory": (lambda d, t: [str(d), "--json", str(t / "no" / "r.json")], "does not exist"),
    "ids_and_prompt": (lambda d, t: [str(d), "--ids", "1", "--prompt", "x"], "not allowed with argument"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_a_message(capsys, default_dir, tmp_path, case):
    setup, message = BAD_INPUTS[case]
    code, out, err = run(capsys, *setup(Path(default_dir), tmp_path), "-q")
    assert code == 2, out + err
    assert message in err, err
    assert "Traceback" not in err


def test_reference_hf_without_transformers_exits_2(capsys, default_dir, monkeypatch):
    import parity.hf_reference

    monkeypatch.setattr(parity.hf_reference, "hf_available", lambda: False)
    code, _, err = run(capsys, str(default_dir), "--reference", "hf", "-q")
    assert code == 2 and "needs Hugging Face transformers" in err


def test_help_tolerances_and_no_command(capsys):
    assert main(["check", "--help"]) == 0
    assert "--reference" in capsys.readouterr().out
    assert main(["check", "--dtype", "bfloat16", "--tolerances"]) == 0
    assert "8u = 3.1e-2" in capsys.readouterr().out
    assert main([]) == 2


@pytest.mark.skipif(not HAS_FUSED, reason="fused kernels (triton, kernels/triton, kernels/pallas) not available")
def test_module_entry_point_sets_up_the_triton_interpreter_itself(default_dir):
    """`python -m parity check --kernels fused` in a fresh process without TRITON_INTERPRET: the CLI sets it. The
    process has none of the test run's compile settings either (tests/conftest.py): the whole check, both
    backends, at XLA's default optimization level, as a user runs it."""
    test_settings = ("TRITON_INTERPRET", "XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if k not in test_settings and not k.startswith("JAX_PERSISTENT_CACHE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "parity", "check", str(default_dir), "--kernels", "fused", "--seq-len", "4", "-q"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS (float32, kernels=fused)" in proc.stdout


def test_fused_without_triton_exits_2(capsys, default_dir, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    code, _, err = run(capsys, str(default_dir), "--kernels", "fused", "-q")
    assert code == 2 and "needs triton" in err


def test_importing_parity_and_its_cli_imports_no_framework():
    """The CLI must be able to set TRITON_INTERPRET before triton loads, so parity imports no framework itself."""
    code = (
        "import sys, parity, parity.__main__; parity.__main__.build_parser(); "
        "print(sorted(m for m in ('torch', 'jax', 'flax', 'triton', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
