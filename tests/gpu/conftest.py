"""Fixtures of the `gpu` tests: each framework's GPU, or a skip that says what is missing.

A `gpu` test checks what a GPU compiles, so it skips rather than quietly testing something else: without a
CUDA device for its framework, or (torch) when this process interprets Triton because it is the CPU suite's
process (tests/conftest.py says when; `pytest -m gpu` and benchmarks/gpu_check.sh run them compiled).
"""

from __future__ import annotations

from typing import Any

import pytest

RUN_THEM = "run them with `pytest -m gpu` or `bash benchmarks/gpu_check.sh`"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The whole-model tests before the kernel cases (each group in its own order): gpu_check.sh stops the tests at
    its time budget, and what that cuts should be kernel cases, which its benchmark runs again, not the model's
    only checks on a GPU."""
    items.sort(key=lambda item: item.path.name != "test_gpu_model.py")


@pytest.fixture(scope="session")
def torch_cuda() -> Any:
    """torch's CUDA device, with float32 matmuls at full precision (no TF32) for the session."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    # torch's default already, made explicit: the float32 checks compare against float32 products, not TF32.
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture(scope="session")
def triton_compiled(torch_cuda: Any) -> None:
    """Skip unless this process compiles the Triton kernels (TRITON_INTERPRET unset when they were imported)."""
    pytest.importorskip("triton")
    from kernels.triton import is_interpreted
    from kernels.triton.rms_norm import _add_rms_norm_kernel

    if is_interpreted(_add_rms_norm_kernel):
        pytest.skip(f"this process interprets Triton (TRITON_INTERPRET=1, the CPU suite's mode): {RUN_THEM}")


@pytest.fixture(scope="session")
def jax_gpu() -> Any:
    """JAX's first GPU device."""
    jax = pytest.importorskip("jax")
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:  # no GPU backend: a CPU-only jaxlib, or JAX_PLATFORMS excludes it
        pytest.skip("no GPU visible to JAX (a CUDA-enabled jaxlib is needed)")


@pytest.fixture(scope="session")
def jax_cpu() -> Any:
    """JAX's CPU device: the reference side of the GPU-vs-CPU checks."""
    jax = pytest.importorskip("jax")
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        pytest.fail("JAX's CPU backend is off (JAX_PLATFORMS?): the CPU reference runs on it")
