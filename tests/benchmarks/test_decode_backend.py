"""benchmarks/decode_backend.py, a backend's process in the decode benchmark: the command line the coordinator
writes is the one it reads; one generation's rates from a loaded model; `--jax-compilation-cache` (JAX's persistent
compilation cache, checked in fresh processes: the cache is JAX's global setting, taken by a process's first
compilation, and this test process already has its own, tests/conftest.py); and `chosen_paths`, which reports what
choosing cost, the decode shapes' part apart, as the backend as shipped chose (`warm_up`)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import cpu_decode, decode_backend
from benchmarks.worker import ROOT

PROGRAM = """
import sys
from pathlib import Path
from benchmarks.decode_backend import use_jax_compilation_cache
before = use_jax_compilation_cache(Path(sys.argv[1]))
import jax, jax.numpy as jnp
jax.jit(lambda x: jnp.tanh(x) * 3.0 + 1.0)(jnp.ones(7)).block_until_ready()  # compiles in far under a second
print(before)
"""


def test_the_coordinators_command_is_the_workers(tmp_path):
    args = cpu_decode.build_parser().parse_args(
        ["--dtype", "bfloat16", "--prompt-len", "33", "--new-tokens", "7", "--jax-compilation-cache", str(tmp_path)]
    )
    for backend in decode_backend.VARIANTS:
        command = cpu_decode.backend_command(args, backend)
        assert command[:2] == ["-m", "benchmarks.decode_backend"]
        got = decode_backend.build_parser().parse_args(command[2:])
        assert (got.backend, got.prompt_len, got.new_tokens, got.dtype, got.model) == (
            backend, 33, 7, "bfloat16", "qwen3-0.6b"
        )  # fmt: skip
        assert got.jax_compilation_cache == tmp_path.resolve()


@pytest.mark.parametrize("backend", ["torch_impl", "jax_impl", "transformers"])
def test_each_variant_measures_one_generation(default_dir, backend):
    prompt = np.array([[5, 9, 200, 7]])
    variants = decode_backend.load_backend(backend, default_dir, "float32", prompt, 3)
    assert tuple(variants) == decode_backend.VARIANTS[backend]
    for name, rates in variants.items():
        measured = rates()
        assert set(measured) == {"prefill", "decode"}, name
        assert measured["prefill"] > 0 and measured["decode"] > 0, (name, measured)


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


def test_the_choosing_cost_of_the_decode_shapes_leaves_out_the_prompts():
    """The prompt's many-row shapes are left out of the decode shapes' cost; the product kernel's fetch choice (a
    decode step's) is in both. Each choice is named with its timings and the rule that decided."""
    from kernels.cpu.gemv_fetch import FETCH
    from spec.path_choice import Choice
    from torch_impl.linear import PATHS

    saved, saved_fetch = PATHS.chosen(), FETCH.chosen()
    PATHS.clear()
    FETCH.clear()
    try:
        PATHS._chosen[(1, 1024, 2048, "float32", False)] = Choice("gemv", {}, 0.25)
        PATHS._chosen[(128, 1024, 2048, "float32", False)] = Choice(
            "onednn", {"f_linear": 0.03, "onednn": 0.02}, 0.5, "median"
        )
        FETCH._chosen[("float32", "rows")] = Choice("hardware", {"ahead": 0.002, "hardware": 0.001}, 0.125, "median")
        report = decode_backend.chosen_paths("torch_impl")
    finally:
        PATHS.clear()
        PATHS._chosen.update(saved)
        FETCH.clear()
        FETCH._chosen.update(saved_fetch)
    assert report["choice_cost_s"] == 0.875 and report["choice_decode_cost_s"] == 0.375
    assert report["paths"] == {
        "1 1024 2048 float32 False": "gemv (by rule, untimed)",
        "128 1024 2048 float32 False": "onednn (f_linear 30.00 ms, onednn 20.00 ms; median)",
        "kernel fetch float32 rows": "hardware (ahead 2.00 ms, hardware 1.00 ms; median)",
    }


def test_the_paths_report_is_the_shipped_variants(default_dir, monkeypatch):
    """jax_impl's per-op variant times the decode products its layers' one call never asks (the test model's weights
    counted as streamed here): the report, read after the shipped variant, leaves them and their cost out."""
    from jax_impl import layer_choice, linear
    from jax_impl.generate import _BY_IDENTITY, _compiled_steps, _step_functions

    monkeypatch.setattr(linear, "MIN_CHOICE_BYTES", 0)
    saved_paths, saved_layers = linear.PATHS.chosen(), layer_choice.LAYERS.chosen()
    linear.PATHS.clear()
    layer_choice.LAYERS.clear()
    try:
        # A fresh trace of every step (new step functions, so new jit caches): one traced before keeps its choices.
        _BY_IDENTITY.clear()
        _compiled_steps.cache_clear()
        _step_functions.cache_clear()
        variants = decode_backend.load_backend("jax_impl", default_dir, "float32", np.array([[5, 9, 200, 7]]), 3)
        _, shipped = decode_backend.warm_up("jax_impl", variants)
        everything = decode_backend.chosen_paths("jax_impl")
    finally:
        linear.PATHS.clear()
        linear.PATHS._chosen.update(saved_paths)
        layer_choice.LAYERS.clear()
        layer_choice.LAYERS._chosen.update(saved_layers)
    decode = {shape for shape in everything["paths"] if shape.startswith("1 ") and shape.endswith("x@W")}
    assert decode, everything  # the layers' products: timed by the per-op variant ...
    assert not decode & set(shipped["paths"]), shipped  # ... only
    assert any(path.startswith("one_call") for path in shipped["paths"].values())
    assert shipped["choice_decode_cost_s"] < everything["choice_decode_cost_s"]
