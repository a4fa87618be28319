"""The gated activations' backward (silu_and_mul, gelu_tanh_and_mul) as one Triton kernel (PyTorch). Twin of
kernels/pallas/swiglu_backward.py.

The forward (kernels/triton/swiglu.py) returns out = D(act(f32(gate)) * f32(up)) on x = [gate | up], with
act(x) = x * sigmoid(z(x)) (kernels/triton/activations.py: z = x for silu, 2 sqrt(2/pi) (x + 0.044715 x^3) for
gelu_tanh). Given the cotangent g of out, this computes, for activation dtype D, everything in float32 and
rounded once:

    sig    = 1 / (1 + exp(-z))
    d_gate = D(((g * up) * sig) * (1 + gate * (1 - sig) * z'))    act'(x) = sig * (1 + x * (1 - sig) * z'(x))
    d_up   = D(g * (gate / (1 + exp(-z))))                       act(gate), the forward's formula

written into one [..., 2I] gradient, gate half first, like x. For silu (z' = 1, never multiplied) this is
PyTorch's autograd of the reference (mul's backward, then silu's backward `dy * sig * (1 + x * (1 - sig))`,
then one cast of the float32 input gradient to D), product for product; only exp's last bits (numpy, CUDA,
XLA, torch) differ. For gelu_tanh it is torch's GeluBackward (tanh) without its 1 + tanh / 1 - tanh^2
cancellation (activations.py says why).

Three layers, as in the forward: the @triton.jit kernel; _block_config and launch_backward; the
torch.autograd.Function in swiglu.py is the wrapper.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.triton import as_rows, check_launchable, grid_blocks
from kernels.triton.activations import ACTIVATIONS, gate_logit, gate_logit_slope, gated_block_config
from kernels.triton.rounding import round_to_dtype

__all__ = ["launch_backward"]

# Four row tiles (gate, up, g and a result) live at once, against the forward's three: half the rows.
_ELEMENTS_PER_PROGRAM = 2048


@triton.jit
def _gated_and_mul_backward_kernel(
    x_ptr,
    d_out_ptr,
    d_x_ptr,
    n_rows,
    n_inter,
    x_row_stride,
    d_out_row_stride,
    ACTIVATION: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    dtype = d_x_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (rows < n_rows)[:, None] & (cols < n_inter)[None, :]  # [BLOCK_ROWS, BLOCK_COLS]
    rows = rows.to(tl.int64)  # row * stride overflows int32 past 2**31 elements

    gate_ptrs = x_ptr + rows[:, None] * x_row_stride + cols[None, :]
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptrs + n_inter, mask=mask, other=0.0).to(tl.float32)  # up starts I columns later
    g = tl.load(d_out_ptr + rows[:, None] * d_out_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)

    denom = 1.0 + tl.exp(-gate_logit(gate, ACTIVATION))
    sig = 1.0 / denom
    slope = gate * (1.0 - sig)
    if ACTIVATION != "silu":
        slope = slope * gate_logit_slope(gate)
    d_gate = g * up * sig * (1.0 + slope)  # left to right, as torch's silu_backward multiplies
    d_up = g * (gate / denom)

    d_gate_ptrs = d_x_ptr + rows[:, None] * (2 * n_inter) + cols[None, :]  # d_x is contiguous [rows, 2I]
    tl.store(d_gate_ptrs, round_to_dtype(d_gate, dtype), mask=mask)
    tl.store(d_gate_ptrs + n_inter, round_to_dtype(d_up, dtype), mask=mask)


# The name docs/tutorial.md's gradient table cites for SwiGLU: the same kernel (ACTIVATION="silu").
_silu_and_mul_backward_kernel = _gated_and_mul_backward_kernel


@functools.cache  # a pure function of the width, asked at every launch: shared, read only
def _block_config(n_inter: int) -> dict[str, int]:
    """Block sizes for a gradient half of width `n_inter` (= I); powers of two for tl.arange."""
    return gated_block_config(
        n_inter, op="gated_and_mul backward", elements_per_program=_ELEMENTS_PER_PROGRAM, elements_per_warp=256
    )


def launch_backward(x: torch.Tensor, d_out: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """d_x [..., 2I] (contiguous, x's dtype) of the gated op at x [..., 2I] for the cotangent d_out [..., I].

    activation: "silu" (silu_and_mul) or "gelu_tanh" (gelu_tanh_and_mul).
    """
    op = f"{ACTIVATIONS[activation]} backward"
    n_inter = x.shape[-1] // 2
    if d_out.shape != (*x.shape[:-1], n_inter) or d_out.dtype != x.dtype:
        raise ValueError(
            f"{op}: d_out is {d_out.dtype}{tuple(d_out.shape)}, expected {x.dtype}{(*x.shape[:-1], n_inter)}"
        )
    check_launchable(op, _gated_and_mul_backward_kernel, x, d_out)
    d_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [..., 2I]
    if d_x.numel() == 0:
        return d_x
    x_rows, d_out_rows = as_rows(x), as_rows(d_out)  # [rows, 2I], [rows, I]
    n_rows = x_rows.shape[0]
    cfg = _block_config(n_inter)
    grid = (grid_blocks(n_rows, cfg["BLOCK_ROWS"]), grid_blocks(n_inter, cfg["BLOCK_COLS"]))
    _gated_and_mul_backward_kernel[grid](
        x_rows,
        d_out_rows,
        d_x,
        n_rows,
        n_inter,
        x_rows.stride(0),
        d_out_rows.stride(0),
        ACTIVATION=activation,
        BLOCK_ROWS=cfg["BLOCK_ROWS"],
        BLOCK_COLS=cfg["BLOCK_COLS"],
        num_warps=cfg["num_warps"],
        enable_fp_fusion=False,  # no FMA contraction: each multiply and add rounds as the reference's ops do
    )
    return d_x
