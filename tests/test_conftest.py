"""The test run's own compile-time settings (tests/conftest.py): what a child that claims the default compiler gets,
the probe that keeps an unknown XLA flag from aborting every test process, and the `gpu` tests' process settings,
the order it starts JAX and torch in, and the order of its tests (tests/gpu/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import tests.conftest as conftest
from tests.conftest import XLA_EMITTER_FLAG, XLA_EXCESS_PRECISION_FLAG, _xla_takes, default_compiler_flags


def test_default_compiler_flags_strip_only_the_runs_own_settings():
    flags = f"--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0 {XLA_EMITTER_FLAG}"
    assert default_compiler_flags(flags) == "--xla_force_host_platform_device_count=4"
    assert default_compiler_flags("--xla_cpu_max_isa=AVX2") == "--xla_cpu_max_isa=AVX2"
    assert default_compiler_flags("") == ""


def test_a_flag_xla_does_not_know_is_refused_by_the_probe():
    assert not _xla_takes("--xla_no_such_flag_in_any_build=true")  # XLA aborts on it: the child fails
    assert _xla_takes("--xla_backend_optimization_level=0")


@pytest.mark.parametrize("user_flags", ["", "--xla_gpu_autotune_level=0", "--xla_allow_excess_precision=true"])
def test_the_gpu_tests_process_keeps_the_references_roundings(monkeypatch, user_flags):
    """`pytest -m gpu` on a CUDA machine: Triton compiled (no TRITON_INTERPRET), no CPU-suite compiler settings, and
    XLA told to keep every conversion the references write, unless the user set that flag themselves."""
    monkeypatch.setattr(conftest, "_selects_only_gpu_tests", lambda config: True)
    monkeypatch.setattr(conftest, "_cuda_available", lambda: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("XLA_FLAGS", user_flags)
    conftest.pytest_configure(None)
    flags = conftest.os.environ["XLA_FLAGS"].split()
    assert "TRITON_INTERPRET" not in conftest.os.environ
    assert not any(f.startswith("--xla_backend_optimization_level") for f in flags)
    if "excess_precision" in user_flags:
        assert flags == [user_flags]
    else:
        assert flags == [*user_flags.split(), XLA_EXCESS_PRECISION_FLAG]
    assert _xla_takes(XLA_EXCESS_PRECISION_FLAG)  # this jaxlib knows it: a process given it starts


_START_ORDER = """
import os, sys
import tests.conftest as conftest
conftest._cuda_available()
names = list(sys.modules)
print(names.index("jax") < names.index("torch"), os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"])
"""


def test_jax_starts_before_torch_in_the_gpu_tests_process():
    """Where torch loads its CUDA libraries first, a jaxlib built against a newer cuDNN starts without its GPU: the
    check for CUDA imports (and starts) JAX first, told not to take most of the GPU's memory at start."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _START_ORDER], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "false"]


def test_the_gpu_tests_run_the_whole_model_first():
    """tests/gpu/conftest.py's order: the model's tests before the kernel cases, each group in its own order."""
    from tests.gpu.conftest import pytest_collection_modifyitems

    names = ["test_gpu_kernels.py", "test_gpu_model.py", "test_gpu_check_script.py", "test_gpu_model.py"]
    items = [SimpleNamespace(path=Path("tests/gpu") / name, n=n) for n, name in enumerate(names)]
    pytest_collection_modifyitems(None, items)
    assert [item.n for item in items] == [1, 3, 0, 2]
