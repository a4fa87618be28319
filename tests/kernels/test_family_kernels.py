"""The kernels issue 15's model families need, run for Triton and for Pallas against each framework's reference:
add_rms_norm's family options (Gemma's offset 1 + w and float32 weight multiply, OLMo 2's float32 weight
multiply), forward and backward, and GeGLU's gelu_tanh_and_mul, forward and backward; then Triton against Pallas.

Bounds: tests/kernels/tolerances.py ("add_rms_norm", "add_rms_norm_float32_weight", "gelu_tanh_and_mul",
"d_gate_up_gelu_tanh", and the backward rows d_x/d_residual/d_weight/contract). Interpreted on CPU (Triton's
interpreter, Pallas' interpret=True): row counts stay small, widths are not powers of two.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.backends import to_numpy
from tests.kernels.frameworks import DTYPES, EPS, FRAMEWORKS, Framework, framework
from tests.kernels.gradients import (
    add_rms_norm_contract_d_s,
    add_rms_norm_term_scales,
    gelu_tanh_and_mul_grad_term_scale,
    gelu_tanh_and_mul_term_scale,
)
from tests.kernels.tolerances import assert_within_tolerance, sample_inputs

# (name, offset, float32_weight): Gemma 2/3, OLMo 2, and the offset alone (defined by the contract, used by none).
FAMILIES = [("gemma", 1.0, True), ("olmo2", 0.0, True), ("offset_only", 1.0, False)]
WIDTHS = (1, 123, 897, 3072)  # one element, odd, Qwen-0.6B + 1, and Gemma 2-2B's 2304's neighbor in blocks of 1024


@pytest.fixture(scope="module", params=FRAMEWORKS)
def fw(request: pytest.FixtureRequest) -> Framework:
    return framework(request.param)


def _family_weight(width: int, offset: float, seed: int = 2) -> np.ndarray:
    """A trained weight as the checkpoint stores it: around 1 applied as w, around 0 stored for offset 1 (1 + w)."""
    return sample_inputs((width,), seed, "weight") - np.float32(offset)


def _rms_quantity(float32_weight: bool) -> str:
    return "add_rms_norm_float32_weight" if float32_weight else "add_rms_norm"


@pytest.mark.parametrize(("family", "offset", "float32_weight"), FAMILIES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_family(fw: Framework, dtype: str, width: int, family: str, offset: float, float32_weight: bool):
    options = {"offset": offset, "float32_weight": float32_weight}
    reference = fw.add_rms_norm_reference_with(offset, float32_weight)
    weight = fw.array(_family_weight(width, offset), dtype)
    for rows, with_residual in ((17, True), (3, False)):
        x = fw.array(sample_inputs((rows, width), 0, "x"), dtype)
        residual = fw.array(sample_inputs((rows, width), 1, "residual"), dtype) if with_residual else None
        got, want = fw.add_rms_norm(x, residual, weight, EPS, **options), reference(x, residual, weight, EPS)
        got, want = (got, want) if with_residual else ((got,), (want,))
        for g, w, quantity in zip(got, want, (_rms_quantity(float32_weight), "new_residual"), strict=False):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert_within_tolerance(to_numpy(g), to_numpy(w), quantity, dtype, f"{family} {(rows, width)}")


def _rms_inputs(shape: tuple[int, ...], with_residual: bool, offset: float) -> dict[str, np.ndarray | None]:
    return {
        "x": sample_inputs(shape, 0, "x"),
        "residual": sample_inputs(shape, 1, "residual") if with_residual else None,
        "weight": _family_weight(shape[-1], offset),
        "d_out": sample_inputs(shape, 3, "cotangent"),
        "d_new_residual": sample_inputs(shape, 4, "cotangent") if with_residual else None,
    }


# (dtype, rows, width, residual): each dtype with and without the residual, widths not powers of two.
RMS_BACKWARD_CASES = [
    ("float32", 17, 897, True),
    ("float32", 3, 123, False),
    ("bfloat16", 17, 1000, True),
    ("bfloat16", 5, 1, False),
    ("float16", 17, 3072, True),
    ("float16", 3, 123, False),
]


@pytest.mark.parametrize(("family", "offset", "float32_weight"), FAMILIES)
@pytest.mark.parametrize(("dtype", "rows", "width", "with_residual"), RMS_BACKWARD_CASES)
def test_add_rms_norm_family_backward(
    fw: Framework, dtype: str, rows: int, width: int, with_residual: bool, family: str, offset: float, float32_weight
):
    """Fused gradients against autograd / jax.vjp of the reference with the same options, and (bf16/fp16)
    against the contract's own rounding points in float64, where float32_weight moved them."""
    options = {"offset": offset, "float32_weight": float32_weight}
    inputs = _rms_inputs((rows, width), with_residual, offset)
    args: list[Any] = [fw.array(a, dtype) if a is not None else None for a in inputs.values()]
    got = fw.add_rms_norm_grads(True, *args, **options)
    want = fw.add_rms_norm_grads(False, *args, **options)
    scale_s, scale_w = add_rms_norm_term_scales(*inputs.values(), dtype, EPS, **options)
    what = f"{family} {(rows, width)}"
    scales = (scale_s, scale_s, scale_w)
    for quantity, g, w, scale in zip(("d_x", "d_residual", "d_weight"), got, want, scales, strict=True):
        if not with_residual and quantity == "d_residual":
            assert g is None and w is None
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, (quantity, g.shape, g.dtype)
        assert_within_tolerance(to_numpy(g), to_numpy(w), quantity, dtype, what, scale)
    if dtype != "float32":
        contract = add_rms_norm_contract_d_s(*inputs.values(), dtype, EPS, **options)
        assert_within_tolerance(to_numpy(got[0]), contract, "contract", dtype, what, scale_s)
        if contract.size >= 10_000:
            assert_within_tolerance(to_numpy(got[0]), contract, "d_s_contract_mismatches", dtype, what)


def test_gemma_rms_norm_known_answer(fw: Framework) -> None:
    """RMSNorm of (3, 4) is (3, 4) / sqrt(12.5) = (0.8485, 1.1314); Gemma applies 1 + w: w = 0 gives that, w = 1
    twice that. OLMo 2 (no offset) with w = 1 gives it too. Forward, and the weight gradient x / rms for g = 1."""
    x = fw.array(np.array([[3.0, 4.0]], np.float32), "float32")
    normed = np.array([[3.0, 4.0]]) / np.sqrt(12.5)
    for w, offset, factor in ((0.0, 1.0, 1.0), (1.0, 1.0, 2.0), (1.0, 0.0, 1.0)):
        weight = fw.array(np.full(2, w, np.float32), "float32")
        got = fw.add_rms_norm(x, None, weight, 1e-12, offset=offset, float32_weight=True)
        np.testing.assert_allclose(to_numpy(got), factor * normed, rtol=1e-6)
    one = fw.array(np.ones((1, 2), np.float32), "float32")
    d_x, _, d_w = fw.add_rms_norm_grads(True, x, None, fw.array(np.zeros(2, np.float32), "float32"), one, None,
                                       offset=1.0, float32_weight=True)  # fmt: skip
    np.testing.assert_allclose(to_numpy(d_w), normed[0], rtol=1e-6)
    # d_x = (g - x_hat * mean(g * x_hat)) / rms with g = 1: (1 - 0.8485 * 0.98995, 1 - 1.1314 * 0.98995) / 3.5355
    want = (1.0 - normed * normed.mean()) / np.sqrt(12.5)
    np.testing.assert_allclose(to_numpy(d_x), want, rtol=1e-5, atol=1e-7)


# exp(-z) overflows to inf for gate below about -7 (z ~ gate^3): gate / inf = -0 is the right limit, numpy warns.
EXP_OVERFLOW = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


@EXP_OVERFLOW
@pytest.mark.parametrize("width", (1, 123, 897, 3072))
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_and_mul(fw: Framework, dtype: str, width: int) -> None:
    x = sample_inputs((17, 2 * width), 7, "gate_up")
    want = to_numpy(fw.gated("gelu_tanh", fused=False)(fw.array(x, dtype)))
    scale = gelu_tanh_and_mul_term_scale(x, dtype)
    for rows in (1, 17):
        got = fw.gated("gelu_tanh")(fw.array(x[:rows], dtype))
        assert got.shape == (rows, width) and str(got.dtype).endswith(dtype)
        what = str((rows, 2 * width))
        assert_within_tolerance(to_numpy(got), want[:rows], "gelu_tanh_and_mul", dtype, what, scale[:rows])


# (dtype, shape of x = [gate | up]): I under one column block and over it (3072: three blocks of 1024), 3-D.
GELU_BACKWARD_CASES = [
    ("float32", (17, 2 * 897)),
    ("float32", (5, 2 * 1)),
    ("bfloat16", (17, 2 * 1000)),
    ("bfloat16", (2, 3, 2 * 1536)),
    ("float16", (17, 2 * 3072)),
    ("float16", (3, 2 * 123)),
]


@EXP_OVERFLOW
@pytest.mark.parametrize(("dtype", "shape"), GELU_BACKWARD_CASES)
def test_gelu_tanh_and_mul_backward(fw: Framework, dtype: str, shape: tuple[int, ...]) -> None:
    x, d_out = sample_inputs(shape, 7, "gate_up"), sample_inputs((*shape[:-1], shape[-1] // 2), 8, "cotangent")
    xd, gd = fw.array(x, dtype), fw.array(d_out, dtype)
    got, want = fw.gated_grads(True, "gelu_tanh", xd, gd), fw.gated_grads(False, "gelu_tanh", xd, gd)
    assert got.shape == shape and got.dtype == xd.dtype
    scale = gelu_tanh_and_mul_grad_term_scale(x, d_out, dtype)
    assert_within_tolerance(to_numpy(got), to_numpy(want), "d_gate_up_gelu_tanh", dtype, str(shape), scale)


@EXP_OVERFLOW
def test_gelu_tanh_and_mul_known_answer(fw: Framework) -> None:
    """gelu_tanh(0) = 0 with slope 1/2; gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) 1.044715)) = 0.8411920, slope
    1.0829640 (torch's and JAX's float64 values); gelu_tanh(-5) = -2.2917e-7 (the tail the sigmoid form keeps)."""
    x = fw.array(np.array([[0.0, 1.0, -5.0, 3.0, 2.0, 1.0]], np.float32), "float32")  # gate (0, 1, -5), up (3, 2, 1)
    u = np.sqrt(2 / np.pi) * (np.array([0.0, 1.0, -5.0]) + 0.044715 * np.array([0.0, 1.0, -125.0]))
    gelu = 0.5 * np.array([0.0, 1.0, -5.0]) * (1 + np.tanh(u))
    np.testing.assert_allclose(gelu[:2], [0.0, 0.8411920], rtol=1e-6)
    np.testing.assert_allclose(to_numpy(fw.gated("gelu_tanh")(x)), [gelu * [3.0, 2.0, 1.0]], rtol=1e-5, atol=1e-12)
    t = np.tanh(u)
    slope = 0.5 * (1 + t) + 0.5 * np.array([0.0, 1.0, -5.0]) * (1 - t * t) * np.sqrt(2 / np.pi) * (
        1 + 3 * 0.044715 * np.array([0.0, 1.0, 25.0])
    )
    np.testing.assert_allclose(slope[:2], [0.5, 1.0829640], rtol=1e-6)
    d = to_numpy(fw.gated_grads(True, "gelu_tanh", x, fw.array(np.ones((1, 3), np.float32), "float32")))
    np.testing.assert_allclose(d[0, :3], slope * [3.0, 2.0, 1.0], rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(d[0, 3:], gelu, rtol=1e-5, atol=1e-12)  # d_up = gelu_tanh(gate)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("offset nan", r"add_rms_norm: offset must be a finite Python float, got nan"),
        ("offset str", r"add_rms_norm: offset must be a finite Python float, got '1'"),
        ("offset bool", r"add_rms_norm: offset must be a finite Python float, got True"),
        ("float32_weight int", r"add_rms_norm: float32_weight must be a bool, got 1"),
        ("gelu int", r"gelu_tanh_and_mul: x has dtype {p}int32; supported dtypes are float32, bfloat16, float16"),
        ("gelu odd width", r"gelu_tanh_and_mul: x must have shape \[\.\.\., 2\*I\].*got \(2, 7\)"),
        ("gelu scalar", r"gelu_tanh_and_mul: x must have shape \[\.\.\., 2\*I\].*got \(\)"),
    ],
)
def test_bad_input_names_the_argument(fw: Framework, case: str, message: str) -> None:
    def ones(shape: tuple[int, ...], dtype: str = "float32"):
        return fw.array(np.ones(shape, np.float32), dtype)

    x, w = ones((2, 8)), ones((8,))
    call = {
        "offset nan": lambda: fw.add_rms_norm(x, None, w, EPS, offset=float("nan")),
        "offset str": lambda: fw.add_rms_norm(x, None, w, EPS, offset="1"),
        "offset bool": lambda: fw.add_rms_norm(x, None, w, EPS, offset=True),
        "float32_weight int": lambda: fw.add_rms_norm(x, None, w, EPS, float32_weight=1),
        "gelu int": lambda: fw.gated("gelu_tanh")(ones((2, 8), "int32")),
        "gelu odd width": lambda: fw.gated("gelu_tanh")(ones((2, 7))),
        "gelu scalar": lambda: fw.gated("gelu_tanh")(ones(())),
    }[case]
    with pytest.raises((ValueError, TypeError), match=message.replace("{p}", fw.dtype_prefix)):
        call()


def test_empty_and_exports(fw: Framework) -> None:
    assert fw.gated("gelu_tanh")(fw.array(np.zeros((2, 0, 8), np.float32), "float32")).shape == (2, 0, 4)
    assert fw.ops.gelu_tanh_and_mul is fw.swiglu.gelu_tanh_and_mul and "gelu_tanh_and_mul" in fw.ops.__all__
    assert "gelu_tanh_and_mul_reference" in fw.ops.__all__


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy (and Triton's numpy interpreter) on overflow
def test_non_finite_inputs_behave_like_the_reference(fw: Framework) -> None:
    """NaN/inf and an fp32 overflow of gate^3 (1e30): NaN and inf exactly where the reference has them."""
    a = np.array([[1.0, np.nan, np.inf, -np.inf, 1e30, -1e30, 0.5, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]], np.float32)
    x = fw.array(a, "float32")
    got, want = to_numpy(fw.gated("gelu_tanh")(x)), to_numpy(fw.ops.gelu_tanh_and_mul_reference(x))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    weight = fw.array(np.zeros(14, np.float32), "float32")
    got = fw.add_rms_norm(x, x, weight, EPS, offset=1.0, float32_weight=True)
    want = fw.ops.add_rms_norm_reference(x, x, weight, EPS, offset=1.0, float32_weight=True)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.isnan(to_numpy(g)), np.isnan(to_numpy(w)))


@EXP_OVERFLOW
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_and_pallas_agree(dtype: str) -> None:
    """Gemma's add_rms_norm and GeGLU, forward and backward, in both frameworks on the same numpy data, to the same
    bounds as each against its reference (shapes of the cases above: no new Pallas compile)."""
    triton, pallas = framework("triton"), framework("pallas")
    options = {"offset": 1.0, "float32_weight": True}
    inputs = _rms_inputs((17, 3072), True, 1.0)
    grads = []
    for fw in (triton, pallas):
        args = [fw.array(a, dtype) for a in inputs.values()]
        outs = fw.add_rms_norm(*args[:3], EPS, **options)
        grads.append([to_numpy(o) for o in (*outs, *fw.add_rms_norm_grads(True, *args, **options))])
    scale_s, scale_w = add_rms_norm_term_scales(*inputs.values(), dtype, EPS, **options)
    quantities = ("add_rms_norm_float32_weight", "new_residual", "d_x", "d_residual", "d_weight")
    for quantity, t, p, scale in zip(quantities, *grads, (None, None, scale_s, scale_s, scale_w), strict=True):
        assert_within_tolerance(t, p, quantity, dtype, "gemma: triton vs pallas", scale)

    x, d_out = sample_inputs((17, 2 * 3072), 7, "gate_up"), sample_inputs((17, 3072), 8, "cotangent")
    t, p = (to_numpy(fw.gated("gelu_tanh")(fw.array(x, dtype))) for fw in (triton, pallas))
    assert_within_tolerance(
        t, p, "gelu_tanh_and_mul", dtype, "triton vs pallas", gelu_tanh_and_mul_term_scale(x, dtype)
    )
    t, p = (
        to_numpy(fw.gated_grads(True, "gelu_tanh", fw.array(x, dtype), fw.array(d_out, dtype)))
        for fw in (triton, pallas)
    )
    scale = gelu_tanh_and_mul_grad_term_scale(x, d_out, dtype)
    assert_within_tolerance(t, p, "d_gate_up_gelu_tanh", dtype, "triton vs pallas", scale)
