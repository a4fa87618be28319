"""The fused backward kernels of each framework against its reference's own gradient (torch autograd /
jax.vjp of kernels/*/reference.py): one set of cases, run for Triton and for Pallas.

Bounds: tests/kernels/tolerances.py (d_x, d_residual, d_weight, d_gate_up); float32 as relative errors,
bfloat16/float16 in ulps at each element's term scale (tests/kernels/gradients.py). What only one framework
has (torch's None cotangents and strided cotangents, once_differentiable; JAX under jit and the GPU lowering)
is in test_triton_kernels.py / test_pallas_kernels.py; Triton against Pallas in test_cross_kernels.py.
Interpreted on CPU, so shapes stay small: each new shape costs Pallas an XLA compile.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.backends import to_numpy
from tests.kernels.frameworks import DTYPES, EPS, FRAMEWORKS, Framework, framework
from tests.kernels.gradients import (
    add_rms_norm_contract_d_s,
    add_rms_norm_contract_d_weight,
    add_rms_norm_term_scales,
    silu_and_mul_term_scale,
)
from tests.kernels.tolerances import assert_within_tolerance, sample_inputs

# Each dtype at three row widths (896 + 1, 1000 and 3072 are real widths and not powers of two; 1 is degenerate:
# its RMSNorm gradient cancels to float32 noise) with odd row counts, with and without the residual. Not the
# full product: each new shape costs the interpreted Pallas kernels an XLA compile. (dtype, rows, width, residual)
RMS_CASES = [
    ("float32", 17, 897, True),
    ("float32", 3, 3072, False),
    ("float32", 5, 1, False),
    ("bfloat16", 17, 1000, True),
    ("bfloat16", 3, 897, False),
    ("bfloat16", 5, 1, True),
    ("float16", 17, 3072, True),
    ("float16", 3, 1000, False),
    ("float16", 7, 1, True),
]
# (dtype, shape of x = [gate | up]): one I under a block, one over (3072 is three column blocks of 1024).
SILU_CASES = [
    ("float32", (17, 2 * 897)),
    ("float32", (2, 3, 2 * 3072)),
    ("float32", (5, 2 * 1)),
    ("bfloat16", (17, 2 * 1000)),
    ("bfloat16", (2, 3, 2 * 1536)),
    ("float16", (17, 2 * 3072)),
    ("float16", (17, 2 * 1000)),
]


@pytest.fixture(scope="module", params=FRAMEWORKS)
def fw(request: pytest.FixtureRequest) -> Framework:
    return framework(request.param)


def _rms_inputs(shape: tuple[int, ...], with_residual: bool, seed: int = 0) -> dict[str, np.ndarray | None]:
    return {
        "x": sample_inputs(shape, seed, "x"),
        "residual": sample_inputs(shape, seed + 1, "residual") if with_residual else None,
        "weight": sample_inputs(shape[-1:], seed + 2, "weight"),
        "d_out": sample_inputs(shape, seed + 3, "cotangent"),
        "d_new_residual": sample_inputs(shape, seed + 4, "cotangent") if with_residual else None,
    }


def check_add_rms_norm_backward(fw: Framework, inputs: dict[str, np.ndarray | None], dtype: str) -> dict[str, float]:
    """Fused vs reference gradients of add_rms_norm on `inputs` (float32 numpy); returns the errors seen."""
    args: list[Any] = [fw.array(a, dtype) if a is not None else None for a in inputs.values()]
    got, want = fw.add_rms_norm_grads(True, *args), fw.add_rms_norm_grads(False, *args)
    scale_s, scale_w = add_rms_norm_term_scales(*inputs.values(), dtype, EPS)
    shape = inputs["x"].shape
    errors = {}
    quantities = ("d_x", "d_residual", "d_weight")
    for quantity, g, w, scale in zip(quantities, got, want, (scale_s, scale_s, scale_w), strict=True):
        if inputs["residual"] is None and quantity == "d_residual":
            assert g is None and w is None
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, (quantity, g.shape, g.dtype)
        errors[quantity] = assert_within_tolerance(to_numpy(g), to_numpy(w), quantity, dtype, str(shape), scale)
    if inputs["residual"] is not None:  # s = x + residual: one gradient for both, the very same values
        np.testing.assert_array_equal(to_numpy(got[0]), to_numpy(got[1]))
    if dtype != "float32":  # the rounding points themselves, which the references' bounds cannot resolve
        contract = add_rms_norm_contract_d_s(*inputs.values(), dtype, EPS)
        errors["contract"] = assert_within_tolerance(to_numpy(got[0]), contract, "contract", dtype, str(shape), scale_s)
        if contract.size >= 10_000:  # a fraction of fewer elements says nothing
            errors["d_s_contract_mismatches"] = assert_within_tolerance(
                to_numpy(got[0]), contract, "d_s_contract_mismatches", dtype, str(shape)
            )
    return errors


@pytest.mark.parametrize(("dtype", "rows", "width", "with_residual"), RMS_CASES)
def test_add_rms_norm_backward(fw: Framework, dtype: str, rows: int, width: int, with_residual: bool) -> None:
    check_add_rms_norm_backward(fw, _rms_inputs((rows, width), with_residual), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_backward_many_rows(fw: Framework, dtype: str) -> None:
    """257 rows of 123: 17 programs each with its partial dW row, the last block ragged."""
    check_add_rms_norm_backward(fw, _rms_inputs((257, 123), with_residual=True), dtype)


def test_add_rms_norm_backward_loops_over_row_blocks(fw: Framework, monkeypatch: pytest.MonkeyPatch) -> None:
    """With at most 4 programs, 33 rows in blocks of 2 are 17 blocks: 5 per program, the last program short.

    On a GPU this is the path of thousands of rows; here the cap is lowered so that a small shape takes it.
    """
    module = fw.rms_norm_backward
    monkeypatch.setattr(module, "_MAX_PROGRAMS", 4)
    cfg = module._block_config(33, 1000)
    assert (cfg["BLOCK_ROWS"], cfg["blocks_per_program"], cfg["n_programs"]) == (2, 5, 4)
    check_add_rms_norm_backward(fw, _rms_inputs((33, 1000), with_residual=True, seed=5), "float32")
    check_add_rms_norm_backward(fw, _rms_inputs((33, 1000), with_residual=False, seed=5), "bfloat16")


@pytest.mark.parametrize(("dtype", "width"), [("bfloat16", 1000), ("float16", 3072)])
def test_add_rms_norm_weight_gradient_follows_contract(fw: Framework, dtype: str, width: int) -> None:
    """d_weight's rounding points (each g * n rounded, a float32 sum, one rounding), which the references'
    2-ulp bound cannot resolve: with weight 1 the forward's out is n itself, bit for bit, so the contract can
    be evaluated in float64 from the kernel's own n. Shapes of RMS_CASES: no new compile."""
    inputs = _rms_inputs((17, width), with_residual=True)
    inputs["weight"] = np.ones(width, np.float32)
    args: list[Any] = [fw.array(a, dtype) for a in inputs.values()]
    n, _ = fw.add_rms_norm(*args[:3], EPS)  # = D(D(s * rstd) * 1) = n
    d_weight = fw.add_rms_norm_grads(True, *args)[2]
    want = add_rms_norm_contract_d_weight(to_numpy(n).astype(np.float64), inputs["d_out"], dtype)
    _, scale_w = add_rms_norm_term_scales(*inputs.values(), dtype, EPS)
    assert_within_tolerance(to_numpy(d_weight), want, "d_weight_contract_mismatches", dtype, "weight 1")
    assert_within_tolerance(to_numpy(d_weight), want, "contract", dtype, "weight 1", scale_w)


def test_add_rms_norm_backward_3d_and_4d(fw: Framework) -> None:
    check_add_rms_norm_backward(fw, _rms_inputs((2, 5, 64), with_residual=True), "bfloat16")  # [batch, seq, H]
    check_add_rms_norm_backward(fw, _rms_inputs((1, 3, 4, 16), with_residual=False), "float32")  # q/k norm heads


def test_add_rms_norm_backward_is_deterministic(fw: Framework) -> None:
    """No atomics: the weight gradient (and everything else) is the same bits on every run."""
    args = [fw.array(a, "float32") if a is not None else None for a in _rms_inputs((257, 123), True).values()]
    first, second = fw.add_rms_norm_grads(True, *args), fw.add_rms_norm_grads(True, *args)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_add_rms_norm_backward_known_answer(fw: Framework) -> None:
    """x = (3, 4), w = 1, g = (1, 0): rms = sqrt(12.5), d_x = (1 - 9/25, -12/25) / rms, d_w = x / rms."""
    x, w, g = (fw.array(np.array(a, np.float32), "float32") for a in ([[3.0, 4.0]], [1.0, 1.0], [[1.0, 0.0]]))
    d_x, d_residual, d_w = fw.add_rms_norm_grads(True, x, None, w, g, None)
    rms = np.sqrt(12.5)
    np.testing.assert_allclose(to_numpy(d_x), [[16 / 25 / rms, -12 / 25 / rms]], rtol=1e-6)
    np.testing.assert_allclose(to_numpy(d_w), [3 / rms, 0.0], rtol=1e-6, atol=1e-7)
    assert d_residual is None


@pytest.mark.parametrize(("dtype", "shape"), SILU_CASES)
def test_silu_and_mul_backward(fw: Framework, dtype: str, shape: tuple[int, ...]) -> None:
    x, d_out = sample_inputs(shape, 7, "gate_up"), sample_inputs((*shape[:-1], shape[-1] // 2), 8, "cotangent")
    xd, gd = fw.array(x, dtype), fw.array(d_out, dtype)
    got, want = fw.silu_and_mul_grads(True, xd, gd), fw.silu_and_mul_grads(False, xd, gd)
    assert got.shape == shape and got.dtype == xd.dtype
    scale = silu_and_mul_term_scale(x, d_out, dtype)
    assert_within_tolerance(to_numpy(got), to_numpy(want), "d_gate_up", dtype, str(shape), scale)


def test_silu_and_mul_backward_known_answer(fw: Framework) -> None:
    """gate = 0: silu' = 1/2, silu = 0; gate = 2: silu' = s(1 + 2(1 - s)), silu = 2s, s = sigmoid(2)."""
    x = fw.array(np.array([[0.0, 2.0, 3.0, 5.0]], np.float32), "float32")  # gate (0, 2), up (3, 5)
    d = to_numpy(fw.silu_and_mul_grads(True, x, fw.array(np.ones((1, 2), np.float32), "float32")))
    s = 1 / (1 + np.exp(-2.0))
    np.testing.assert_allclose(d, [[3 * 0.5, 5 * s * (1 + 2 * (1 - s)), 0.0, 2 * s]], rtol=1e-6)


def test_backward_of_empty_input(fw: Framework) -> None:
    x, w = fw.array(np.zeros((0, 8), np.float32), "float32"), fw.array(np.ones(8, np.float32), "float32")
    d_x, d_residual, d_w = fw.add_rms_norm_grads(True, x, x, w, x, x)
    assert d_x.shape == d_residual.shape == (0, 8) and d_w.shape == (8,)
    np.testing.assert_array_equal(to_numpy(d_w), np.zeros(8))
    assert fw.silu_and_mul_grads(True, x, fw.array(np.zeros((0, 4), np.float32), "float32")).shape == (0, 8)
