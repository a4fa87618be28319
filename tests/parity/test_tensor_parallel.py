"""`check --tp N` and `generate --tp N` end to end (subprocesses: JAX reads its device count at import)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parity", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


def test_check_tp2_passes_and_compares_sharded_logits(default_dir):
    result = cli("check", str(default_dir), "--tp", "2", "-q", "--seq-len", "9", "--batch", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith("PASS") and "torch/tp2 vs jax/tp2" in verdict and "jax/tp2 vs jax" in verdict


def test_generate_tp2_both_backends_identical(default_dir):
    result = cli("generate", str(default_dir), "--ids", "5,9,200", "--max-new-tokens", "6", "--no-eos", "--tp", "2",
                 "--backend", "both")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torch and jax generated identical tokens (6 in all)" in result.stdout


def test_bad_degree_exits_2_naming_it(default_dir):
    result = cli("check", str(default_dir), "--tp", "3", "-q")
    assert result.returncode == 2
    assert "degree 3 does not fit this model: it does not divide num_attention_heads=4" in result.stderr
