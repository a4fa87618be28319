"""Across frameworks: the Triton and the Pallas kernel agree on the same numpy data, to the same bounds as
each against its own reference (tests/kernels/tolerances.py); plus the framework-neutral pieces (the
`kernels=` switch, lazy imports) and the benchmark's CPU behavior.

The shapes repeat test_pallas_kernels.py's, so in one pytest run the interpreted Pallas kernels are already
compiled when these tests reach them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernels import KERNEL_CHOICES, resolve_kernels
from tests.kernels.tolerances import assert_within_tolerance, sample_inputs

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (1, 123, 1000, 896, 1024, 1536, 3072)
DTYPES = ("float32", "bfloat16", "float16")
EPS = 1e-6


def test_resolve_kernels() -> None:
    assert KERNEL_CHOICES == ("reference", "fused", "auto")
    assert resolve_kernels("auto", on_gpu=True) == "fused"
    assert resolve_kernels("auto", on_gpu=False) == "reference"
    for choice in ("reference", "fused"):
        assert resolve_kernels(choice, on_gpu=True) == resolve_kernels(choice, on_gpu=False) == choice
    with pytest.raises(ValueError, match=r"kernels='triton' is not one of \('reference', 'fused', 'auto'\)"):
        resolve_kernels("triton", on_gpu=True)


def test_imports_stay_lazy() -> None:
    """`kernels` imports no framework; the reference modules import no kernel compiler."""
    code = (
        "import sys, kernels\n"
        "assert not {'torch', 'jax'} & set(sys.modules), 'kernels imported a framework'\n"
        "import kernels.triton.reference, kernels.pallas.reference, kernels.triton, kernels.pallas\n"
        "assert 'triton' not in sys.modules, 'triton imported'\n"
        "assert 'jax.experimental.pallas' not in sys.modules, 'pallas imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_benchmark_without_gpu_says_so_and_exits_0() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark would run for real")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [sys.executable, "benchmarks/kernels.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "needs a GPU" in done.stdout


torch = pytest.importorskip("torch")
pytest.importorskip("triton")
jax = pytest.importorskip("jax")

import ml_dtypes  # noqa: E402

from kernels import pallas as pallas_kernels  # noqa: E402
from kernels import triton as triton_kernels  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _both(a: np.ndarray, dtype: str) -> tuple[torch.Tensor, jax.Array]:
    """The same values in both frameworks: one numpy cast (round to nearest-even, as torch's own cast does)."""
    rounded = a.astype(NUMPY_DTYPES[dtype])
    t = torch.from_numpy(a).to(device=DEVICE, dtype=TORCH_DTYPES[dtype])
    assert np.array_equal(t.float().cpu().numpy(), rounded.astype(np.float32), equal_nan=True)
    return t, jax.numpy.asarray(rounded)


def _np(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().float().cpu().numpy()
    return np.asarray(a).astype(np.float32)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_and_pallas_agree(dtype: str, width: int) -> None:
    shape = (17, width)
    (xt, xj), (rt, rj) = _both(sample_inputs(shape, 0, "x"), dtype), _both(sample_inputs(shape, 1, "residual"), dtype)
    wt, wj = _both(sample_inputs((width,), 2, "weight"), dtype)
    out_t, res_t = triton_kernels.add_rms_norm(xt, rt, wt, EPS)
    out_j, res_j = pallas_kernels.add_rms_norm(xj, rj, wj, EPS)
    assert_within_tolerance(_np(out_t), _np(out_j), "add_rms_norm", dtype, f"triton vs pallas {shape}")
    assert_within_tolerance(_np(res_t), _np(res_j), "new_residual", dtype, f"triton vs pallas {shape}")

    gt, gj = _both(sample_inputs((17, 2 * width), 7, "gate_up"), dtype)
    got_t, got_j = triton_kernels.silu_and_mul(gt), pallas_kernels.silu_and_mul(gj)
    assert_within_tolerance(_np(got_t), _np(got_j), "silu_and_mul", dtype, f"triton vs pallas {(17, 2 * width)}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_and_jax_references_agree(dtype: str) -> None:
    """The two references are the same contract: same bounds between them as between kernel and reference."""
    shape = (5, 896)
    (xt, xj), (rt, rj) = _both(sample_inputs(shape, 0, "x"), dtype), _both(sample_inputs(shape, 1, "residual"), dtype)
    wt, wj = _both(sample_inputs((896,), 2, "weight"), dtype)
    (out_t, res_t), (out_j, res_j) = (
        triton_kernels.add_rms_norm_reference(xt, rt, wt, EPS),
        pallas_kernels.add_rms_norm_reference(xj, rj, wj, EPS),
    )
    assert_within_tolerance(_np(out_t), _np(out_j), "add_rms_norm", dtype, "torch vs jax reference")
    assert_within_tolerance(_np(res_t), _np(res_j), "new_residual", dtype, "torch vs jax reference")
    gt, gj = _both(sample_inputs((5, 2 * 896), 7, "gate_up"), dtype)
    got_t, got_j = triton_kernels.silu_and_mul_reference(gt), pallas_kernels.silu_and_mul_reference(gj)
    assert_within_tolerance(_np(got_t), _np(got_j), "silu_and_mul", dtype, "torch vs jax reference")


def test_known_answer_in_both() -> None:
    want = [[3 / np.sqrt(12.5), 4 / np.sqrt(12.5)]]  # rms of (3, 4) is sqrt(12.5): [0.8485, 1.1314]
    x, weight = torch.tensor([[3.0, 4.0]], device=DEVICE), torch.ones(2, device=DEVICE)
    t = triton_kernels.add_rms_norm(x, None, weight, 1e-12)
    j = pallas_kernels.add_rms_norm(jax.numpy.array([[3.0, 4.0]]), None, jax.numpy.ones(2), 1e-12)
    np.testing.assert_allclose(_np(t), want, rtol=1e-6)
    np.testing.assert_allclose(_np(j), want, rtol=1e-6)


def test_block_configs_are_twins() -> None:
    """Both kernels tile identically, so a GPU profile of one explains the other."""
    import importlib

    for name in ("add_rms_norm", "silu_and_mul"):
        t = importlib.import_module(f"kernels.triton.{name}")._block_config
        p = importlib.import_module(f"kernels.pallas.{name}")._block_config
        assert all(t(width) == p(width) for width in (*WIDTHS, 9728, 65536))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy (and Triton's numpy interpreter) on overflow
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_inputs_behave_like_the_reference(dtype: str) -> None:
    """NaN/inf (and an fp32 overflow of the sum of squares) poison exactly the rows the reference's do."""
    a = np.array([[1.0, np.nan, 3.0, 0.5], [1.0, np.inf, 2.0, 0.5], [1e30, 1e30, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    (xt, xj), (wt, wj) = _both(a.astype(np.float32), dtype), _both(np.ones(4, np.float32), dtype)
    for got, want in [
        (triton_kernels.add_rms_norm(xt, xt, wt, EPS), triton_kernels.add_rms_norm_reference(xt, xt, wt, EPS)),
        (pallas_kernels.add_rms_norm(xj, xj, wj, EPS), pallas_kernels.add_rms_norm_reference(xj, xj, wj, EPS)),
        ((triton_kernels.silu_and_mul(xt),), (triton_kernels.silu_and_mul_reference(xt),)),
        ((pallas_kernels.silu_and_mul(xj),), (pallas_kernels.silu_and_mul_reference(xj),)),
    ]:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.isnan(_np(g)), np.isnan(_np(w)))
            np.testing.assert_array_equal(np.isinf(_np(g)), np.isinf(_np(w)))
