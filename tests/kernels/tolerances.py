"""The one tolerance table for the kernel tests (Triton, Pallas, and Triton-vs-Pallas), and its checker.

Framework-neutral: everything here works on numpy arrays, so the torch and the JAX tests (and the cross
test) apply literally the same bounds.
"""

from __future__ import annotations

import numpy as np

_FP32_WHY = (
    "same fp32 math, but the row sum is reduced in a different order and rsqrt/exp come from different "
    "libraries (numpy, XLA, torch, CUDA): a few fp32 ulps (1.2e-7 relative) of the largest value"
)

# (quantity, dtype) -> (kind, bound, why). kind: "exact" (bit-identical), "abs" (|a - b| / max(1, max|ref|)),
# "ulp" (|a - b| / ulp(ref), elementwise, in the dtype's own ulp: 2**(exponent - 7) bf16, 2**(exponent - 10) fp16).
TOLERANCES: dict[tuple[str, str], tuple[str, float, str]] = {
    **{
        ("new_residual", dtype): (
            "exact",
            0.0,
            "fp32(x) + fp32(residual) is one IEEE fp32 add, then one IEEE rounding to the dtype: every "
            "implementation performs the same two correctly rounded operations",
        )
        for dtype in ("float32", "bfloat16", "float16")
    },
    ("silu_and_mul", "float32"): ("abs", 1e-6, _FP32_WHY),
    ("silu_and_mul", "bfloat16"): (
        "ulp",
        1.0,
        "fp32 math rounded once at the end: an fp32 difference of a few ulps can at most flip that rounding",
    ),
    ("silu_and_mul", "float16"): ("ulp", 1.0, "as bfloat16"),
    ("add_rms_norm", "float32"): ("abs", 1e-6, _FP32_WHY),
    ("add_rms_norm", "bfloat16"): (
        "ulp",
        2.0,
        "two roundings, as the contract demands (HF's `weight * normed.to(dtype)`): the fp32 normalized value "
        "is rounded to the dtype -- where a few-fp32-ulp difference can flip one ulp -- and then multiplied by "
        "the weight and rounded again (that product itself is exact in fp32, so it rounds exactly like the "
        "reference's). A 1-ulp flip u of normed becomes |w| * u <= 2 * ulp(out) for any weight, since "
        "ulp(w * n) >= |w| * ulp(n) / 2; hence 2, not 1",
    ),
    ("add_rms_norm", "float16"): ("ulp", 2.0, "as bfloat16 (seen in practice: fp16 has 3 fewer bits of slack)"),
}

_MANTISSA_BITS = {"bfloat16": 7, "float16": 10}
_MIN_NORMAL_EXPONENT = {"bfloat16": -126, "float16": -14}


def ulp(ref: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of `dtype` numbers at |ref|: 2**(floor(log2|ref|) - mantissa bits), subnormal spacing near 0."""
    _, exp = np.frexp(np.abs(ref.astype(np.float64)))  # |ref| = m * 2**exp, m in [0.5, 1)
    exponent = np.maximum(exp - 1, _MIN_NORMAL_EXPONENT[dtype])
    return np.ldexp(1.0, exponent - _MANTISSA_BITS[dtype])


def max_error(actual: np.ndarray, ref: np.ndarray, kind: str, dtype: str) -> float:
    """The error in the unit of `kind`: abs error / max(1, max|ref|), or max ulps of `dtype`."""
    actual, ref = np.asarray(actual, np.float64), np.asarray(ref, np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf; equal infinities are no error
        diff = np.where(actual == ref, 0.0, np.abs(actual - ref))
    if diff.size == 0:
        return 0.0
    if kind == "ulp":
        return float((diff / ulp(ref, dtype)).max())
    return float(diff.max() / max(1.0, float(np.abs(ref).max())))


def assert_within_tolerance(actual: np.ndarray, ref: np.ndarray, quantity: str, dtype: str, what: str = "") -> float:
    """Assert `actual` matches `ref` to the table's bound for (quantity, dtype); returns the error observed."""
    actual, ref = np.asarray(actual, np.float64), np.asarray(ref, np.float64)
    assert actual.shape == ref.shape, f"{what}: shape {actual.shape} != {ref.shape}"
    assert np.array_equal(np.isnan(actual), np.isnan(ref)), f"{what}: NaNs at different places"
    ok = ~np.isnan(ref)
    kind, bound, why = TOLERANCES[(quantity, dtype)]
    err = max_error(actual[ok], ref[ok], kind, dtype)
    assert err <= bound, f"{quantity} {what} [{dtype}]: error {err:.3g} ({kind}) exceeds {bound} -- {why}"
    return err


def sample_inputs(shape: tuple[int, ...], seed: int, kind: str) -> np.ndarray:
    """Deterministic float32 test data; every framework casts the same array to the dtype under test.

    kind: "x" (a sublayer output), "residual" (the residual stream, larger), "weight" (a trained RMSNorm
    gain, around 1), "gate_up" (pre-activation MLP values, wide enough to reach silu's saturated tails).
    """
    rng = np.random.default_rng(seed)
    scale, offset = {"x": (2.0, 0.0), "residual": (4.0, 0.0), "weight": (0.5, 1.0), "gate_up": (3.0, 0.0)}[kind]
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)
