"""`check --tp N` and `generate --tp N` end to end (subprocesses: JAX reads its device count at import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parity", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


def python(code: str) -> subprocess.CompletedProcess:
    """A fresh interpreter without XLA_FLAGS: whatever sets up the devices must be the project's own code."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def test_generate_tp2_both_backends_identical(default_dir):
    result = cli("generate", str(default_dir), "--ids", "5,9,200", "--max-new-tokens", "6", "--no-eos", "--tp", "2",
                 "--backend", "both")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torch and jax generated identical tokens (6 in all)" in result.stdout


def test_bad_degree_exits_2_naming_it(default_dir):
    result = cli("check", str(default_dir), "--tp", "3", "-q")
    assert result.returncode == 2
    assert "degree 3 does not fit this model: it does not divide num_attention_heads=4" in result.stderr


def test_python_check_tp2_from_a_fresh_interpreter(default_dir):
    """`parity.check(..., tp=2)` sets up the simulated devices itself: no XLA_FLAGS, no prior setup; and it compares
    the sharded logits of both backends with each other and with the unsharded model's. (The CLI's `--tp` reaches
    the same call: `check --steps --tp 2` below goes through it; a forward-only CLI run cost CI 13-17 s more.)"""
    code = (
        "import os, sys, parity\n"
        "assert 'XLA_FLAGS' not in os.environ and 'jax' not in sys.modules\n"
        f"report = parity.check({str(default_dir)!r}, tp=2, seq_len=5, batch=2)\n"
        "labels = [c.label for c in report.comparisons]\n"
        "print(report.passed, labels)\n"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("True"), result.stdout
    assert "'torch/tp2 vs jax/tp2'" in result.stdout and "'jax/tp2 vs jax'" in result.stdout, result.stdout


def test_python_check_tp_after_jax_started_names_the_fix(default_dir):
    """Once JAX has started with one CPU device, a larger mesh cannot be had: a clear InputError, not a crash."""
    code = (
        "import jax, jax.numpy as jnp, parity, spec\n"
        "jnp.zeros(1).block_until_ready()\n"
        "try:\n"
        f"    parity.check({str(default_dir)!r}, tp=2, seq_len=5)\n"
        "except spec.InputError as err:\n"
        "    print('refused:', err)\n"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused:" in result.stdout and "prepare_environment(tp=2)" in result.stdout, result.stdout


def test_check_grad_and_steps_tp2_compare_sharded_gradients_and_training(default_dir):
    """--grad --tp: the loss and gradients from vocabulary-sharded logits; --steps with --tp: both backends also train
    on 2 devices and their parameters after the step are compared with each other and with their own unsharded
    step (replicated kv heads, tp > n_kv, are covered by the backends' own tests)."""
    result = cli("check", str(default_dir), "--steps", "1", "--tp", "2", "-q", "--seq-len", "7", "--batch", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith("PASS") and "torch/tp2 vs jax/tp2 on 25 gradients" in verdict
    assert "jax/tp2 vs jax on 25 gradients" in verdict and "torch/tp2 vs torch on 25 gradients" in verdict
    for pair in ("torch/tp2 vs jax/tp2", "torch/tp2 vs torch", "jax/tp2 vs jax"):
        line = next(line for line in result.stdout.splitlines() if line.strip().startswith(f"{pair}: losses"))
        assert line.endswith(" ok"), line


def test_check_expert_parallel_passes(hf_checkpoint):
    """check --ep 2 (E = 6 experts, 3 per rank): sharded logits equal the unsharded ones and each other within the
    float32 table. TP 2 x EP 2 (4 processes / devices) is checked in each backend's own EP tests
    (tests/*/test_expert_parallel.py); through the CLI it cost 20 s of CI for the same wiring as --ep alone."""
    for name, degrees, label in (("qwen3_moe_e6k4", ["--ep", "2"], "ep2"),):
        result = cli("check", str(hf_checkpoint(name)), *degrees, "-q", "--seq-len", "9", "--batch", "2")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        verdict = result.stdout.strip().splitlines()[-1]
        assert (
            verdict.startswith("PASS")
            and f"torch/{label} vs jax/{label}" in verdict
            and f"jax/{label} vs jax" in verdict
        )


def test_generate_expert_parallel_both_backends_identical(hf_checkpoint):
    # 2 ranks, not mixtral_e5k2's 5 (each a torch process on CI's 2 cores: 24 s); the backends' own EP tests
    # cover more experts per rank and other routings
    result = cli("generate", str(hf_checkpoint("qwen3_moe_e6k4")), "--ids", "5,9,200", "--max-new-tokens", "6",
                 "--no-eos", "--ep", "2", "--backend", "both")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torch and jax generated identical tokens (6 in all)" in result.stdout
