"""Shared fixtures (the built-in default checkpoint, transformers-written checkpoints) and kernel mode.

Triton decides between interpreting and compiling once per process: it reads TRITON_INTERPRET when a kernel
is decorated, i.e. when kernels.triton.rms_norm is first imported. So it is set here, in pytest_configure,
before any test module imports it, and one pytest process tests one of the two:

- the CPU suite (every run, GPU or not, except the one below): TRITON_INTERPRET=1, so that the fused
  kernels run on the CPU tensors the suite uses (on a GPU machine too: there a compiled kernel would
  refuse them);
- the `gpu` tests alone (`pytest -m gpu`, or only paths under tests/gpu) on a machine with CUDA: left
  unset, so that Triton compiles the kernels the GPU tests exist to check (benchmarks/gpu_check.sh runs
  them this way). Run in the CPU suite's process, those tests skip and say so.

setdefault: an explicit TRITON_INTERPRET=0/1 from the user wins. Pallas needs nothing: it decides per call
from the input's device.

XLA compilation is most of the JAX tests' time (measured on tests/jax_impl/test_moe*.py + test_window_cache.py,
2-core Intel: 145 s; 42 s with every program already in a compilation cache). Two settings for the test
process, both set before any worker starts so the xdist workers and the processes tests spawn inherit them:

- one persistent compilation cache per test run (a temporary directory, removed at the end): a program
  another test or worker already compiled is read back instead of compiled again (-12% on that subset);
- XLA's backend (LLVM) optimization level 0 (-37%), and XLA:CPU's older loop emitters for its fusions in place of
  the fusion emitters (`--xla_cpu_use_fusion_emitters=false`: the default checkpoint's forward compiled in
  0.23-0.25 s against 0.50-0.56 s, its gradient in 0.46-0.60 s against 1.15-1.24 s; tests/jax_impl/
  test_window_cache.py on one core 43 s against 70 s; AMD EPYC, 2026-12-03): both compile faster and run
  slower, and the test models are tiny. They change float32 results at the last-ulp level (default
  checkpoint: logits and gradients within 1e-6 relative of the default build's; bfloat16 logits
  bit-identical), inside every bound the tests use, which are reviewed for the reorderings of correct code.
  What users run is the default compiler: the fresh-interpreter tests (tests/parity/test_tensor_parallel.py,
  tests/parity/test_cli.py's default-compilation check) drop XLA_FLAGS and run the whole check with it. XLA
  aborts the process on a flag its build does not know, so the emitter flag is added only where a child
  process shows this jaxlib takes it (`_xla_takes`: a jax release may drop it; the optimization level is
  long-standing).

Each is a default only: a JAX_COMPILATION_CACHE_DIR or an optimization level in XLA_FLAGS from the user wins
(with their own level, the emitter flag is left to them too).

The `gpu` tests' process gets one XLA setting instead: `--xla_allow_excess_precision=false`. They hold each compiled
kernel to its jitted reference, which rounds to the activation dtype where the contract does (docs/design.md, "The
numerics contract of add_rms_norm"); XLA's GPU compiler, by default, removes a float32 -> bfloat16 -> float32 pair
of conversions (its simplify-fp-conversions pass), so the reference would normalize an unrounded residual sum that
the kernel, rightly, rounds first, and differ from it by more than the table's ulps for a reason that is the
compiler's, not the kernel's. XLA on CPU keeps those conversions in these references, so the CPU suite needs no such
flag.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

GPU_TESTS = Path(__file__).resolve().parent / "gpu"


def _cuda_available() -> bool:
    """Whether torch sees a CUDA device. JAX's client is started first where JAX is installed: where torch loads its
    CUDA libraries first, a jaxlib built against a newer cuDNN than the one torch loaded starts without its GPU. So
    the caller sets JAX's settings for the process before this, and JAX is told not to take most of the GPU's memory
    at start (a default only), which the torch tests of the same process need."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax

        jax.devices()
    except Exception:  # no jax, or a jaxlib that cannot start: torch decides alone
        pass
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _selects_only_gpu_tests(config: pytest.Config) -> bool:
    """True for `pytest -m gpu` and for runs given only paths under tests/gpu."""
    if (config.getoption("markexpr", "") or "").strip() == "gpu":
        return True
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    return bool(paths) and all(path == GPU_TESTS or GPU_TESTS in path.parents for path in paths)


XLA_OPT_FLAG = "--xla_backend_optimization_level"
XLA_EMITTER_FLAG = "--xla_cpu_use_fusion_emitters=false"
XLA_EXCESS_PRECISION_FLAG = "--xla_allow_excess_precision=false"  # the gpu tests' process (module docstring)


def default_compiler_flags(flags: str) -> str:
    """XLA_FLAGS without this module's compile-time settings: for a child process whose test claims something of
    the compiler users run."""
    ours = (XLA_OPT_FLAG, XLA_EMITTER_FLAG.partition("=")[0])
    return " ".join(f for f in flags.split() if not f.startswith(ours))


OWN_CACHE = pytest.StashKey[str]()  # the compilation cache directory this process made, removed when it ends


def _compile_faster(config: pytest.Config) -> None:
    """The two compile-time settings of the module docstring, as defaults (the controller sets them once; a
    worker finds them set)."""
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        config.stash[OWN_CACHE] = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(
            prefix="decoder-parity-xla-"
        )
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # small programs are the many
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    flags = os.environ.get("XLA_FLAGS", "")
    if XLA_OPT_FLAG not in flags:  # the controller; a worker inherits what it set
        emitters = XLA_EMITTER_FLAG if _xla_takes(XLA_EMITTER_FLAG) else ""
        os.environ["XLA_FLAGS"] = f"{flags} {XLA_OPT_FLAG}=0 {emitters}".strip()


def _xla_takes(flag: str) -> bool:
    """Whether this jaxlib starts with `flag` in XLA_FLAGS (it aborts the process on a flag it does not know)."""
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    probe = [sys.executable, "-c", "import jax; jax.devices()"]
    return subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0


def _share_cores(config: pytest.Config) -> None:
    """xdist workers share the cores: each worker's torch gets its share of OpenMP threads (a default only). With
    2 workers on 2 cores each worker's torch otherwise runs 2 threads, and a team that waits spins on the core
    the other worker needs (a CI-sized subset: -9% wall). Tests that are about thread counts set theirs."""
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


def pytest_configure(config: pytest.Config) -> None:
    gpu_only = _selects_only_gpu_tests(config)
    if gpu_only and XLA_EXCESS_PRECISION_FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):  # the user's wins
        # Before _cuda_available starts JAX. Without CUDA the gpu tests skip; the script's own tests do not need it.
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {XLA_EXCESS_PRECISION_FLAG}".strip()
    if not (gpu_only and _cuda_available()):
        os.environ.setdefault("TRITON_INTERPRET", "1")
        _compile_faster(config)  # a GPU run measures the default compiler's kernels: left as it is
        _share_cores(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    if OWN_CACHE in config.stash:
        shutil.rmtree(config.stash[OWN_CACHE], ignore_errors=True)


@pytest.fixture(scope="session")
def default_dir(tmp_path_factory):
    import spec

    return spec.default_checkpoint(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """hf_checkpoint(name) -> directory written by transformers' save_pretrained (cached per session)."""
    from tests.hf_models import save_hf_checkpoint

    made: dict[str, object] = {}

    def make(name: str):
        if name not in made:
            made[name] = save_hf_checkpoint(name, tmp_path_factory.mktemp(name))
        return made[name]

    return make
