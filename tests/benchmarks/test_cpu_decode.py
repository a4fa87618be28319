"""benchmarks/cpu_decode.py's `--jax-compilation-cache`: the option the benchmark offers for JAX's persistent
compilation cache. Each check runs in a fresh process, as the benchmark's worker does: the cache is JAX's global
setting, taken by a process's first compilation, and this test process already has its own (tests/conftest.py).
And `chosen_paths`, which reports what choosing cost, the decode shapes' part apart."""

from __future__ import annotations

import os
import subprocess
import sys

from benchmarks.worker import ROOT

PROGRAM = """
import sys
from pathlib import Path
from benchmarks.cpu_decode import use_jax_compilation_cache
before = use_jax_compilation_cache(Path(sys.argv[1]))
import jax, jax.numpy as jnp
jax.jit(lambda x: jnp.tanh(x) * 3.0 + 1.0)(jnp.ones(7)).block_until_ready()  # compiles in far under a second
print(before)
"""


def entries_before(directory) -> int:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("JAX_PERSISTENT_CACHE") and k != "JAX_COMPILATION_CACHE_DIR"
    }
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(directory)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_second_process_starts_from_the_programs_the_first_compiled(tmp_path):
    directory = tmp_path / "jax-cache"  # made by the option
    assert entries_before(directory) == 0
    assert entries_before(directory) > 0  # the small program was kept: JAX's one-second floor is lifted


def test_a_cache_path_that_is_not_a_directory_is_refused_before_any_worker_starts(tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cpu_decode", "--jax-compilation-cache", str(taken)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"--jax-compilation-cache {taken}: not a usable directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_choosing_cost_of_the_decode_shapes_leaves_out_the_prompts():
    from benchmarks.cpu_decode import chosen_paths
    from spec.path_choice import Choice
    from torch_impl.linear import PATHS

    saved = PATHS.chosen()
    PATHS.clear()
    try:
        PATHS._chosen[(1, 1024, 2048, "float32", False)] = Choice("gemv", {}, 0.25)
        PATHS._chosen[(128, 1024, 2048, "float32", False)] = Choice("onednn", {}, 0.5)
        report = chosen_paths("torch_impl")
    finally:
        PATHS.clear()
        PATHS._chosen.update(saved)
    assert report["choice_cost_s"] == 0.75 and report["choice_decode_cost_s"] == 0.25
    assert report["paths"] == {"1 1024 2048 float32 False": "gemv", "128 1024 2048 float32 False": "onednn"}
