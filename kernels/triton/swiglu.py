"""SwiGLU's activation, silu(gate) * up on a merged [..., 2I] input, as a Triton kernel (PyTorch).
Twin of kernels/pallas/swiglu.py.

Contract and numerics: kernels/triton/reference.py::silu_and_mul_reference (gate is the first half, up the
second; computed in fp32, cast to the activation dtype once). Three layers, Liger-Kernel style:

    _silu_and_mul_kernel   @triton.jit: one program computes a [BLOCK_ROWS, BLOCK_COLS] tile of the output
    _block_config/_launch  block sizes (a pure function of I), checks, the launch
    silu_and_mul           the public entry point; autograd-aware (backward: kernels/triton/swiglu_backward.py)

Elementwise, so the columns are tiled too: any I works, with no cap on the width.
Inputs may be row-strided views (no copy); a non-unit stride along the last dim is copied first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernels.triton import as_rows, check_launchable
from kernels.triton.reference import check_silu_and_mul_args
from kernels.triton.rounding import round_to_dtype
from kernels.triton.swiglu_backward import launch_backward

__all__ = ["silu_and_mul"]

_MAX_BLOCK_COLS = 1024
_ELEMENTS_PER_PROGRAM = 4096


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    n_inter,
    x_row_stride,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (rows < n_rows)[:, None] & (cols < n_inter)[None, :]  # [BLOCK_ROWS, BLOCK_COLS]
    rows = rows.to(tl.int64)  # row * stride overflows int32 past 2**31 elements

    gate_ptrs = x_ptr + rows[:, None] * x_row_stride + cols[None, :]
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptrs + n_inter, mask=mask, other=0.0).to(tl.float32)  # up starts I columns later
    # x / (1 + exp(-x)) is the formula torch's silu uses; sigmoid(x) * x would round differently.
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(
        out_ptr + rows[:, None] * n_inter + cols[None, :], round_to_dtype(out, out_ptr.dtype.element_ty), mask=mask
    )


def _block_config(n_inter: int) -> dict[str, int]:
    """Block sizes for an output row of width `n_inter` (= I); powers of two for tl.arange."""
    if n_inter < 1:
        raise ValueError(f"silu_and_mul: output width must be >= 1, got {n_inter}")
    block_cols = min(triton.next_power_of_2(n_inter), _MAX_BLOCK_COLS)
    block_rows = _ELEMENTS_PER_PROGRAM // block_cols
    num_warps = min(max(block_rows * block_cols // 512, 1), 8)
    return {"BLOCK_ROWS": block_rows, "BLOCK_COLS": block_cols, "num_warps": num_warps}


def _launch(x: torch.Tensor) -> torch.Tensor:
    """Run the kernel on a checked x [..., 2I]; returns a new contiguous [..., I] tensor."""
    check_launchable("silu_and_mul", _silu_and_mul_kernel, x)
    n_inter = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], n_inter), dtype=x.dtype, device=x.device)  # [..., I]
    if out.numel() == 0:
        return out
    x_rows = as_rows(x)  # [rows, 2I]
    n_rows = x_rows.shape[0]
    cfg = _block_config(n_inter)
    grid = (triton.cdiv(n_rows, cfg["BLOCK_ROWS"]), triton.cdiv(n_inter, cfg["BLOCK_COLS"]))
    _silu_and_mul_kernel[grid](
        x_rows,
        out,
        n_rows,
        n_inter,
        x_rows.stride(0),
        BLOCK_ROWS=cfg["BLOCK_ROWS"],
        BLOCK_COLS=cfg["BLOCK_COLS"],
        num_warps=cfg["num_warps"],
        enable_fp_fusion=False,  # no FMA contraction: every multiply and add rounds like the reference's ops
    )
    return out


class _SiluAndMulFunction(torch.autograd.Function):
    """Forward: the fused kernel. Backward: the fused backward kernel (kernels/triton/swiglu_backward.py)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _launch(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return launch_backward(x, grad_out)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Fused `silu_and_mul_reference`: x [..., 2I] (gate first) -> [..., I] in x's dtype.

    Differentiable: under autograd the backward runs the fused backward kernel (see _SiluAndMulFunction).
    """
    check_silu_and_mul_args(x)
    if torch.is_grad_enabled() and x.requires_grad:
        return _SiluAndMulFunction.apply(x)
    return _launch(x)
