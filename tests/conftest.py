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
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

GPU_TESTS = Path(__file__).resolve().parent / "gpu"


def _cuda_available() -> bool:
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


def pytest_configure(config: pytest.Config) -> None:
    if not (_selects_only_gpu_tests(config) and _cuda_available()):
        os.environ.setdefault("TRITON_INTERPRET", "1")


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
