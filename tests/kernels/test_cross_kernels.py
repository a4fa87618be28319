"""Across frameworks: the Triton and the Pallas kernel agree on the same numpy data, to the same bounds as
each against its own reference (tests/kernels/tolerances.py); plus the framework-neutral pieces (the
`kernels=` switch, lazy imports) and the benchmark's CPU behavior.

The shapes repeat test_kernels.py's, so in one pytest run the interpreted Pallas kernels compile once for
both files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernels import KERNEL_CHOICES, resolve_kernels
from tests.backends import to_numpy
from tests.kernels.frameworks import DTYPES, EPS, WIDTHS, framework
from tests.kernels.gradients import add_rms_norm_term_scales, silu_and_mul_term_scale
from tests.kernels.tolerances import assert_within_tolerance, sample_inputs

ROOT = Path(__file__).resolve().parents[2]


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


# Below: both frameworks at once (importing either skips this whole module where it is not installed).
TRITON, PALLAS = framework("triton"), framework("pallas")
triton_kernels, pallas_kernels = TRITON.ops, PALLAS.ops


def _both(a: np.ndarray, dtype: str) -> tuple[Any, Any]:
    """The same values in both frameworks: torch's cast and numpy's (ml_dtypes) both round to nearest-even."""
    t, j = TRITON.array(a, dtype), PALLAS.array(a, dtype)
    assert np.array_equal(to_numpy(t), to_numpy(j), equal_nan=True)
    return t, j


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_and_pallas_agree(dtype: str, width: int) -> None:
    shape = (17, width)
    (xt, xj), (rt, rj) = _both(sample_inputs(shape, 0, "x"), dtype), _both(sample_inputs(shape, 1, "residual"), dtype)
    wt, wj = _both(sample_inputs((width,), 2, "weight"), dtype)
    out_t, res_t = triton_kernels.add_rms_norm(xt, rt, wt, EPS)
    out_j, res_j = pallas_kernels.add_rms_norm(xj, rj, wj, EPS)
    assert_within_tolerance(to_numpy(out_t), to_numpy(out_j), "add_rms_norm", dtype, f"triton vs pallas {shape}")
    assert_within_tolerance(to_numpy(res_t), to_numpy(res_j), "new_residual", dtype, f"triton vs pallas {shape}")

    gt, gj = _both(sample_inputs((17, 2 * width), 7, "gate_up"), dtype)
    got_t, got_j = triton_kernels.silu_and_mul(gt), pallas_kernels.silu_and_mul(gj)
    assert_within_tolerance(
        to_numpy(got_t), to_numpy(got_j), "silu_and_mul", dtype, f"triton vs pallas {(17, 2 * width)}"
    )


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
    assert_within_tolerance(to_numpy(out_t), to_numpy(out_j), "add_rms_norm", dtype, "torch vs jax reference")
    assert_within_tolerance(to_numpy(res_t), to_numpy(res_j), "new_residual", dtype, "torch vs jax reference")
    gt, gj = _both(sample_inputs((5, 2 * 896), 7, "gate_up"), dtype)
    got_t, got_j = triton_kernels.silu_and_mul_reference(gt), pallas_kernels.silu_and_mul_reference(gj)
    assert_within_tolerance(to_numpy(got_t), to_numpy(got_j), "silu_and_mul", dtype, "torch vs jax reference")


def test_known_answer_in_both() -> None:
    want = [[3 / np.sqrt(12.5), 4 / np.sqrt(12.5)]]  # rms of (3, 4) is sqrt(12.5): [0.8485, 1.1314]
    (xt, xj), (wt, wj) = _both(np.array([[3.0, 4.0]], np.float32), "float32"), _both(np.ones(2, np.float32), "float32")
    t = triton_kernels.add_rms_norm(xt, None, wt, 1e-12)
    j = pallas_kernels.add_rms_norm(xj, None, wj, 1e-12)
    np.testing.assert_allclose(to_numpy(t), want, rtol=1e-6)
    np.testing.assert_allclose(to_numpy(j), want, rtol=1e-6)


def test_block_configs_are_twins() -> None:
    """Both kernels tile identically, so a GPU profile of one explains the other."""
    for t, p in [
        (TRITON.rms_norm, PALLAS.rms_norm),
        (TRITON.swiglu, PALLAS.swiglu),
        (TRITON.swiglu_backward, PALLAS.swiglu_backward),
    ]:
        assert all(t._block_config(width) == p._block_config(width) for width in (*WIDTHS, 9728, 65536))
    # The backward's program count too: the weight gradient's partial sums are then added in the same groups.
    t, p = TRITON.rms_norm_backward, PALLAS.rms_norm_backward
    for rows in (1, 17, 257, 4099, 100_000):
        assert all(t._block_config(rows, width) == p._block_config(rows, width) for width in (*WIDTHS, 9728))


# Shapes of test_backward_kernels.py's cases, so that the interpreted Pallas kernels compile once for both files.
@pytest.mark.parametrize(
    ("dtype", "rows", "width", "with_residual"),
    [("float32", 17, 897, True), ("bfloat16", 17, 1000, True), ("float16", 3, 1000, False)],
)
def test_triton_and_pallas_backward_agree(dtype: str, rows: int, width: int, with_residual: bool) -> None:
    shape = (rows, width)
    inputs = {
        "x": sample_inputs(shape, 0, "x"),
        "residual": sample_inputs(shape, 1, "residual") if with_residual else None,
        "weight": sample_inputs((width,), 2, "weight"),
        "d_out": sample_inputs(shape, 3, "cotangent"),
        "d_new_residual": sample_inputs(shape, 4, "cotangent") if with_residual else None,
    }
    both = [_both(a, dtype) if a is not None else (None, None) for a in inputs.values()]
    got_t = TRITON.add_rms_norm_grads(True, *(t for t, _ in both))
    got_j = PALLAS.add_rms_norm_grads(True, *(j for _, j in both))
    scale_s, scale_w = add_rms_norm_term_scales(*inputs.values(), dtype, EPS)
    for quantity, t, j, scale in zip(
        ("d_x", "d_residual", "d_weight"), got_t, got_j, (scale_s, scale_s, scale_w), strict=True
    ):
        if with_residual or quantity != "d_residual":
            assert_within_tolerance(to_numpy(t), to_numpy(j), quantity, dtype, f"triton vs pallas {shape}", scale)

    gate_up, d_out = sample_inputs((17, 2 * width), 7, "gate_up"), sample_inputs((17, width), 8, "cotangent")
    (gt, gj), (dt, dj) = _both(gate_up, dtype), _both(d_out, dtype)
    t, j = TRITON.silu_and_mul_grads(True, gt, dt), PALLAS.silu_and_mul_grads(True, gj, dj)
    scale = silu_and_mul_term_scale(gate_up, d_out, dtype)
    assert_within_tolerance(to_numpy(t), to_numpy(j), "d_gate_up", dtype, f"triton vs pallas {gate_up.shape}", scale)


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
            np.testing.assert_array_equal(np.isnan(to_numpy(g)), np.isnan(to_numpy(w)))
            np.testing.assert_array_equal(np.isinf(to_numpy(g)), np.isinf(to_numpy(w)))
