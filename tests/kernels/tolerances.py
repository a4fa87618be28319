"""The one tolerance table for the kernel tests (Triton, Pallas, and Triton-vs-Pallas), and its checker.

Framework-neutral: everything here works on numpy arrays, so the torch and the JAX tests (and the cross
test) apply literally the same bounds. The backward rows (d_x, d_residual, d_weight, d_gate_up) bound the
fused backward kernels against the reference's own autograd (torch) / jax.vjp (JAX); their contract is in
kernels/triton/rms_norm_backward.py and swiglu_backward.py (docs/design.md, "The numerics contract of
add_rms_norm"). tests/kernels/gradients.py computes the term scales their "term_ulp" rows need.
"""

from __future__ import annotations

import numpy as np

_FP32_WHY = (
    "same fp32 math, but the row sum is reduced in a different order and rsqrt/exp come from different "
    "libraries (numpy, XLA, torch, CUDA): a few fp32 ulps (1.2e-7 relative) of the largest value"
)

_GRAD_FP32_WHY = (
    "the same float32 formulas as autograd's, but rstd, mean(dy * s) and the sums come from other reduction "
    "orders and rsqrt/exp libraries: a few float32 ulps of the largest gradient (measured: d_x 6.9e-8, "
    "d_gate_up 1.7e-7)"
)
_TERM_ULP_WHY = (
    "in ulps of the dtype at the element's term scale (the sum of |terms| the contract adds in float32 to form "
    "it, tests/kernels/gradients.py): an element that cancels below its terms is not determined to its own ulp "
    "by any float32 computation. Two implementations of the contract differ by one final rounding flip "
    "(<= 1 ulp); the jitted JAX reference also skips the intermediate roundings (XLA's excess precision: "
    "D(g * w), D(d_s) before adding g_s, D(g * n) before the row sum), each worth <= 1/2 ulp of a term, together "
    "<= 1 ulp at the scale; hence 2 (measured: Pallas vs the jitted JAX reference 2.0 bf16, 1.0 fp16; Triton vs "
    "torch's reference 0 bf16, 0.5 fp16)"
)

# GeGLU's bounds, in float32 ulps at the term scale beyond one final rounding (see the rows).
GELU_FORWARD_BOUND = 8.0
GELU_BACKWARD_BOUND = 16.0

# (quantity, dtype) -> (kind, bound, why). kind:
#   "exact"     bit-identical;
#   "abs"       max|a - b| / max(1, max|ref|);
#   "rel"       max|a - b| / max|ref|, or / the largest term scale where the caller passes term scales and it is
#               larger (an RMSNorm over one element has a gradient that cancels to float32 noise);
#   "ulp"       |a - b| / ulp(ref), elementwise, in the dtype's own ulp: 2**(exponent - 7) bf16, 2**(exponent - 10)
#               fp16;
#   "term_ulp"  |a - b| / ulp(max(|ref|, scale)): "ulp" at the element's term scale, which the caller passes;
#   "mismatch_fraction"  the fraction of elements that are not bit-identical;
#   "f32_noise" (|a - b| - ulp(ref)) / ulp_f32(scale), elementwise, at least 0: one final rounding of the dtype is
#               free, the rest is counted in float32 ulps at the element's term scale, which the caller passes
#               (for ops computed in float32 and rounded once, where the reference itself cancels: its
#               result there is float32 noise of the terms, not its own value to its own ulp).
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
    # Backward (kernel vs the reference's autograd / jax.vjp). d_x and d_residual are one tensor, d_s.
    ("d_x", "float32"): ("rel", 1e-6, _GRAD_FP32_WHY),
    ("d_x", "bfloat16"): ("term_ulp", 2.0, _TERM_ULP_WHY),
    ("d_x", "float16"): ("term_ulp", 2.0, "as bfloat16; fp16's extra bits change nothing in the argument"),
    # The fused kernel against the contract itself (tests/kernels/gradients.py: float64 with the contract's
    # roundings), a stricter oracle than the references for the rounding points: no excess precision.
    **{
        ("contract", dtype): (
            "term_ulp",
            1.0,
            "the kernel's float32 against float64, both rounded at the same points: only the final rounding can "
            "flip (results on one grid differ by a whole step, or by less than the float32 noise where the "
            "element cancels below its terms). d_weight is checked this way only from the forward kernel's own "
            "n (weight 1): n = D(s * rstd) flips about once in 2**15 elements between float32 and float64 rstd",
        )
        for dtype in ("bfloat16", "float16")
    },
    # ... and how many of its elements differ from the contract at all: a skipped or added rounding point stays
    # within 1 ulp but moves ~15% of the elements. Checked on tensors of >= 10**4 elements only.
    ("d_s_contract_mismatches", "bfloat16"): (
        "mismatch_fraction",
        2e-4,
        "the final rounding flips only where the float32 value lies within its noise (<= 4 float32 ulps) of a "
        "rounding boundary: about 4 * 2**-24 / (1.5 * 2**-8) = 2e-5 of the elements; 10x that (measured 0)",
    ),
    ("d_s_contract_mismatches", "float16"): (
        "mismatch_fraction",
        2e-3,
        "as bfloat16 with 3 more bits: 4 * 2**-24 / (1.5 * 2**-11) = 1.6e-4; 10x that (measured <= 1e-4)",
    ),
    # d_weight against the contract computed from the forward kernel's own n (the weight is 1, so out = n):
    # float64 sums of the same rounded products, so only the final rounding can flip.
    ("d_weight_contract_mismatches", "bfloat16"): (
        "mismatch_fraction",
        1e-2,
        "a float32 sum of R rounded products is off by <= R * 2**-24 * sum|g * n|, which crosses a rounding "
        "boundary of the dtype for about R * 2**-16 * sum|g * n| / |d_w| of the columns: ~1e-3 for 17 rows; 10x "
        "that (measured 0). Products left unrounded (as XLA's excess precision leaves them) move ~50%",
    ),
    ("d_weight_contract_mismatches", "float16"): (
        "mismatch_fraction",
        5e-2,
        "as bfloat16 with 3 more bits: ~8e-3 for 17 rows, about 6x that (measured 0)",
    ),
    ("d_residual", "float32"): ("rel", 1e-6, "d_residual is d_x (s = x + residual): " + _GRAD_FP32_WHY),
    ("d_residual", "bfloat16"): ("term_ulp", 2.0, "d_residual is d_x: " + _TERM_ULP_WHY),
    ("d_residual", "float16"): ("term_ulp", 2.0, "d_residual is d_x: as bfloat16"),
    ("d_weight", "float32"): (
        "rel",
        1e-5,
        "a float32 sum over every row (tokens): the kernels add per-program partials in program order, autograd "
        "and XLA in their own orders; the error grows with the row count (measured 1.3e-7 at 257 rows)",
    ),
    ("d_weight", "bfloat16"): (
        "term_ulp",
        2.0,
        "scale = sum over rows of |g * n|: per-row products rounded to the dtype (the jitted JAX reference "
        "does not round them: <= 1/2 ulp of each term, <= 1 ulp at the scale in all), float32 sums in any "
        "order (negligible), one final rounding (<= 1 ulp); hence 2 (measured 2.0 against the jitted JAX "
        "reference, bf16 and fp16; 0 against torch's)",
    ),
    ("d_weight", "float16"): ("term_ulp", 2.0, "as bfloat16"),
    ("d_gate_up", "float32"): ("rel", 1e-6, _GRAD_FP32_WHY),
    ("d_gate_up", "bfloat16"): (
        "term_ulp",
        1.0,
        "float32 products rounded once, as autograd does: a few-float32-ulp difference (exp's libraries, product "
        "order) can at most flip that rounding; scale = |g * up| * sig * (1 + |gate| * (1 - sig)) for d_gate "
        "(silu' cancels near gate = -1.28), |g * silu(gate)| for d_up (measured: 1.0 Pallas vs JAX, 0.5 Triton vs "
        "torch)",
    ),
    ("d_gate_up", "float16"): ("term_ulp", 1.0, "as bfloat16"),
    # The CPU decode-step operators (kernels/cpu/decode_ops.c) against the references they stand in for.
    **{
        ("rotary", dtype): (
            "exact",
            0.0,
            "the reference's own float32 operations in its order (x * cos, rotate_half(x) * sin, their sum, one "
            "rounding), built without fused multiply-adds (-ffp-contract=off): each a correctly rounded IEEE "
            "operation, so the same bits on any processor",
        )
        for dtype in ("float32", "bfloat16")
    },
    ("attention", "float32"): (
        "abs",
        1e-5,
        "each score is a d-term float32 dot product summed in another order than the reference's BLAS (8 lanes, "
        "fused multiply-adds), a few float32 ulps of |q| |k| apart; the softmax turns a score's absolute error "
        "into a relative one of its probability, and the output is a probability-weighted mean of v, so the "
        "difference is a few such ulps of max|v| (measured: 2.9e-6, 20 seeds x 5 shapes, d up to 128, up to "
        "2048 keys, inputs of scale 2)",
    ),
    ("attention", "bfloat16"): (
        "abs",
        2.0**-7 + 1e-5,
        "the float32 row's difference, then one rounding to bfloat16 that it can flip: one bfloat16 ulp of a "
        "value <= max|out| is <= 2**-7 of it (measured: 2.2e-3)",
    ),
    # The model families' options (issue 15). add_rms_norm with offset alone (w applied as D(offset + w)) is the
    # "add_rms_norm" row: the same two roundings, the same 1 + 1 ulp argument. With float32_weight:
    ("add_rms_norm_float32_weight", "float32"): ("abs", 1e-6, _FP32_WHY),
    ("add_rms_norm_float32_weight", "bfloat16"): (
        "ulp",
        1.0,
        "Gemma's / OLMo 2's order: the whole product in float32, rounded once, so only the fp32 noise of rsqrt and "
        "the row sum can flip that one rounding (the weight multiply is no longer a second rounding; measured "
        "0 bf16 and 1 fp16, Triton and Pallas)",
    ),
    ("add_rms_norm_float32_weight", "float16"): ("ulp", 1.0, "as bfloat16"),
    # GeGLU. The kernels compute gate * sigmoid(2u) (kernels/triton/activations.py), the references torch's
    # 0.5 gate (1 + tanh(u)), which for u << 0 keeps only the float32 noise of 1 + tanh(u): their own value is
    # not determined there, only to a few float32 ulps of the terms 0.5 |gate * up| (1 + |tanh u|).
    **{
        ("gelu_tanh_and_mul", dtype): (
            "f32_noise",
            GELU_FORWARD_BOUND,
            "float32 math rounded once: one flip of that rounding is free; beyond it, the two float32 values differ "
            "by tanh's error (<= 1-2 float32 ulps of |t| <= 1 in torch's, XLA's and the kernels' sigmoid form) "
            "times 0.5 |gate * up|, plus the products' own roundings: <= ~6 float32 ulps at the term scale; 8 "
            "(measured, rows of 123/897/3072: Triton vs torch 2 fp32, 0.23 bf16, 0.19 fp16; Pallas vs the jitted "
            "JAX reference 3 fp32, 1.1 bf16, 1.6 fp16)",
        )
        for dtype in ("float32", "bfloat16", "float16")
    },
    **{
        ("d_gate_up_gelu_tanh", dtype): (
            "f32_noise",
            GELU_BACKWARD_BOUND,
            "float32 products rounded once, as autograd does: one flip is free; beyond it, torch's GeluBackward "
            "(and jax.grad's) 0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2) carries tanh's error through "
            "1 + t and 1 - t^2 (each <= 2 float32 ulps of 1) times factors up to the term scale "
            "(tests/kernels/gradients.py), plus four products' roundings: <= ~8; 16 for the GPUs' tanh/exp, not "
            "measured here (measured on CPU: Triton vs torch 2.5 fp32, 0.44 bf16/fp16; Pallas vs JAX 4 fp32, "
            "1.9 bf16, 3.1 fp16)",
        )
        for dtype in ("float32", "bfloat16", "float16")
    },
}

_MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}
_MIN_NORMAL_EXPONENT = {"bfloat16": -126, "float16": -14, "float32": -126}


def ulp(ref: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of `dtype` numbers at |ref|: 2**(floor(log2|ref|) - mantissa bits), subnormal spacing near 0."""
    _, exp = np.frexp(np.abs(ref.astype(np.float64)))  # |ref| = m * 2**exp, m in [0.5, 1)
    exponent = np.maximum(exp - 1, _MIN_NORMAL_EXPONENT[dtype])
    return np.ldexp(1.0, exponent - _MANTISSA_BITS[dtype])


def max_error(actual: np.ndarray, ref: np.ndarray, kind: str, dtype: str, scale: np.ndarray | None = None) -> float:
    """The error in the unit of `kind`: abs error / max(1, max|ref|), / max(|ref|, scale), or max ulps of `dtype`
    (for "term_ulp", ulps at max(|ref|, scale) elementwise).

    Only the elements that differ are widened to float64 and measured: a GPU test's arrays hold ~40M elements, of
    which a correct kernel leaves most bit-equal to the reference, and widening them all cost seconds a check."""
    actual, ref = _floats(actual), _floats(ref)
    if ref.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        differs = actual != ref  # exact in the arrays' own dtypes; equal infinities are no error
    if kind == "mismatch_fraction":
        return float(np.count_nonzero(differs) / differs.size)
    largest = float(np.abs(ref).max())  # over every element (exact in ref's dtype): rel and abs kinds
    if kind == "rel" and scale is not None:
        largest = max(largest, float(np.max(scale)))
    if not differs.any():
        return 0.0
    ref_d = ref[differs].astype(np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(actual[differs].astype(np.float64) - ref_d)  # inf where one side is infinite
    if scale is not None:
        scale = np.broadcast_to(np.asarray(scale, np.float64), differs.shape)[differs]
    if kind == "ulp":
        return float((diff / ulp(ref_d, dtype)).max())
    if kind == "f32_noise":
        assert scale is not None, "an f32_noise bound needs the elements' term scale"
        excess = np.maximum(diff - ulp(ref_d, dtype), 0.0)
        return float((excess / ulp(scale, "float32")).max())
    if kind == "term_ulp":
        assert scale is not None, "a term_ulp bound needs the elements' term scale"
        return float((diff / ulp(np.maximum(np.abs(ref_d), scale), dtype)).max())
    if kind == "rel":
        if largest == 0:
            return float("inf")  # a difference where every reference element and scale is 0
        return float(diff.max() / largest)
    return float(diff.max() / max(1.0, largest))


def _floats(a: np.ndarray) -> np.ndarray:
    """float32 or float64 as given; narrower floats (bfloat16, float16) widened to float32, which holds them."""
    a = np.asarray(a)
    return a if a.dtype in (np.float32, np.float64) else a.astype(np.float32)


def assert_within_tolerance(
    actual: np.ndarray, ref: np.ndarray, quantity: str, dtype: str, what: str = "", scale: np.ndarray | None = None
) -> float:
    """Assert `actual` matches `ref` to the table's bound for (quantity, dtype); returns the error observed.

    scale: the elements' term scale (broadcastable to ref; tests/kernels/gradients.py), which "term_ulp" rows
    need and "rel" rows use where it exceeds the reference; other kinds ignore it.
    """
    actual, ref = _floats(actual), _floats(ref)
    assert actual.shape == ref.shape, f"{what}: shape {actual.shape} != {ref.shape}"
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(actual), nan), f"{what}: NaNs at different places"
    if nan.any():  # compared where the reference is a number
        ok = ~nan
        if scale is not None:
            scale = np.broadcast_to(np.asarray(scale, np.float64), ref.shape)[ok]
        actual, ref = actual[ok], ref[ok]
    kind, bound, why = TOLERANCES[(quantity, dtype)]
    err = max_error(actual, ref, kind, dtype, scale)
    assert err <= bound, f"{quantity} {what} [{dtype}]: error {err:.3g} ({kind}) exceeds {bound} -- {why}"
    return err


def sample_inputs(shape: tuple[int, ...], seed: int, kind: str) -> np.ndarray:
    """Deterministic float32 test data; every framework casts the same array to the dtype under test.

    kind: "x" (a sublayer output), "residual" (the residual stream, larger), "weight" (a trained RMSNorm
    gain, around 1), "gate_up" (pre-activation MLP values, wide enough to reach silu's saturated tails),
    "cotangent" (a gradient arriving at an output).
    """
    rng = np.random.default_rng(seed)
    scale, offset = {
        "x": (2.0, 0.0),
        "residual": (4.0, 0.0),
        "weight": (0.5, 1.0),
        "gate_up": (3.0, 0.0),
        "cotangent": (1.0, 0.0),
    }[kind]
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)
