"""The gate activations of the gated MLP kernels (swiglu.py, swiglu_backward.py), and their shared tiling.
Twin of kernels/pallas/activations.py.

Both activations are act(x) = x * sigmoid(z(x)):

    silu       z = x
    gelu_tanh  z = 2u, u = sqrt(2/pi) * (x + 0.044715 x^3)       since 0.5 x (1 + tanh(u)) = x * sigmoid(2u)

so one kernel computes either, forward x / (1 + exp(-z)) and backward act'(x) = sig * (1 + x * (1 - sig) * z'(x)),
sig = sigmoid(z). For silu that is, operation for operation, what torch's silu and silu_backward compute
(z' = 1 is never multiplied). For gelu_tanh it is torch's gelu(approximate="tanh") rewritten without its
cancellation: torch forms 1 + tanh(u) and 1 - tanh(u)^2, which for u << 0 subtract nearly equal float32
numbers and keep only a few float32 ulps of 1 (the tolerance rows "gelu_tanh_and_mul" / "d_gate_up_gelu_tanh"
bound the difference by that noise); sigmoid(2u) and 1 - sigmoid(2u) = 1 / (1 + exp(2u)) have none.
Triton's interpreter has no tanh either (libdevice is compiled-only): exp is all this needs.

Its own module, like rounding.py, so that the forward and backward kernel modules share it.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["ACTIVATIONS", "gate_logit", "gate_logit_slope", "gated_block_config"]

# activation -> the op's public name (error messages, kernel names)
ACTIVATIONS = {"silu": "silu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}

# 2 * sqrt(2 / pi): z = 2u. A power of two times torch's kBeta, so the same float32 bits up to the exponent.
# (tl.constexpr: a @triton.jit function may read no other globals.)
_TWO_BETA = tl.constexpr(1.5957691216057308)
_KAPPA = tl.constexpr(0.044715)
_MAX_BLOCK_COLS = 1024


@triton.jit
def gate_logit(gate, ACTIVATION: tl.constexpr):
    """z(gate), float32: act(gate) = gate * sigmoid(z)."""
    if ACTIVATION == "silu":
        z = gate
    else:
        z = _TWO_BETA * (gate + _KAPPA * gate * gate * gate)
    return z


@triton.jit
def gate_logit_slope(gate):
    """dz/dgate for the non-silu activations (silu's is 1, which the kernels never multiply by)."""
    return _TWO_BETA * (1.0 + 3.0 * _KAPPA * gate * gate)


def gated_block_config(n_inter: int, *, op: str, elements_per_program: int, elements_per_warp: int) -> dict[str, int]:
    """Block sizes for a gated kernel over [rows, I] (the output, or each half of the gradient); powers of two for
    tl.arange. Columns are tiled (no cap on I); the forward and the backward differ only in the elements a
    program and a warp hold (the backward keeps one more live tile)."""
    if n_inter < 1:
        raise ValueError(f"{op}: width I must be >= 1, got {n_inter}")
    block_cols = min(triton.next_power_of_2(n_inter), _MAX_BLOCK_COLS)
    block_rows = max(1, elements_per_program // block_cols)
    num_warps = min(max(block_rows * block_cols // elements_per_warp, 1), 8)
    return {"BLOCK_ROWS": block_rows, "BLOCK_COLS": block_cols, "num_warps": num_warps}
