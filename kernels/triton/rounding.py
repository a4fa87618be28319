"""The float32 -> activation-dtype cast every Triton kernel here ends with (forward and backward alike).

Its own module so that the forward and backward kernel modules (rms_norm.py, rms_norm_backward.py,
swiglu.py, swiglu_backward.py) can share it without importing each other.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton import is_interpreted

__all__ = ["round_to_dtype"]


@triton.jit
def round_to_dtype(x, dtype: tl.constexpr):
    """Cast fp32 `x` to `dtype` rounding to nearest-even, identically compiled and interpreted.

    Triton's interpreter truncates fp32 -> bf16 (a GPU rounds to nearest-even), which would make CPU runs
    disagree with torch by an ulp; so where this module is interpreted (BY_HAND), the cast rounds by hand on
    the bits, exactly as the GPU's cvt.rn.bf16.f32 does. Compiled, the cast is that one instruction: rounded by
    hand, add_rms_norm's four casts an element were a large share of a kernel held to a share of the copy
    bandwidth (docs/benchmarks.md).
    """
    if BY_HAND and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + (0x7FFF + ((bits >> 16) & 1))  # round half to even on the 16 bits dropped
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(x == x, rounded, x.to(tl.bfloat16))  # NaN must stay NaN, not carry into the sign
    else:
        return x.to(dtype)


# Whether this process interprets the kernels: Triton decided it when it decorated round_to_dtype (TRITON_INTERPRET
# at import, kernels/triton/__init__.py), and every kernel here was decorated in the same process.
BY_HAND = tl.constexpr(is_interpreted(round_to_dtype))
