"""The gated MLP activations, act(gate) * up on a merged [..., 2I] input, as one Triton kernel (PyTorch): SwiGLU's
silu (`silu_and_mul`) and GeGLU's tanh-approximated GELU (`gelu_tanh_and_mul`, Gemma). Twin of
kernels/pallas/swiglu.py; the module keeps SwiGLU's name, which parity/environment.py and the docs cite.

Contracts and numerics: kernels/triton/reference.py::silu_and_mul_reference / gelu_tanh_and_mul_reference (gate
is the first half, up the second; computed in fp32, cast to the activation dtype once). The activation is a
compile-time choice of one kernel (kernels/triton/activations.py: both are gate * sigmoid(z(gate))). Three
layers, Liger-Kernel style:

    _gated_and_mul_kernel   @triton.jit: one program computes a [BLOCK_ROWS, BLOCK_COLS] tile of the output
    _block_config/_launch   block sizes (a pure function of I), checks, the launch
    silu_and_mul, gelu_tanh_and_mul
                            the public entry points; autograd-aware (backward: kernels/triton/swiglu_backward.py)

Elementwise, so the columns are tiled too: any I works, with no cap on the width.
Inputs may be row-strided views (no copy); a non-unit stride along the last dim is copied first.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernels.triton import as_rows, check_launchable, grid_blocks
from kernels.triton.activations import ACTIVATIONS, gate_logit, gated_block_config
from kernels.triton.reference import check_silu_and_mul_args
from kernels.triton.rounding import round_to_dtype
from kernels.triton.swiglu_backward import launch_backward

__all__ = ["gelu_tanh_and_mul", "silu_and_mul"]

_ELEMENTS_PER_PROGRAM = 4096


# n_rows not specialized: Triton compiles a kernel of its own for an integer argument equal to 1, and one row (a
# decode step) and many (a prompt) then cost two compilations of the same code.
@triton.jit(do_not_specialize=["n_rows"])
def _gated_and_mul_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    n_inter,
    x_row_stride,
    ACTIVATION: tl.constexpr,
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
    # x / (1 + exp(-z)): for silu (z = x) the formula torch's silu uses; sigmoid(x) * x would round differently.
    out = gate / (1.0 + tl.exp(-gate_logit(gate, ACTIVATION))) * up
    tl.store(
        out_ptr + rows[:, None] * n_inter + cols[None, :], round_to_dtype(out, out_ptr.dtype.element_ty), mask=mask
    )


@functools.cache  # a pure function of the width, asked at every launch: shared, read only
def _block_config(n_inter: int) -> dict[str, int]:
    """Block sizes for an output row of width `n_inter` (= I); powers of two for tl.arange."""
    return gated_block_config(
        n_inter, op="gated_and_mul", elements_per_program=_ELEMENTS_PER_PROGRAM, elements_per_warp=512
    )


def _launch(x: torch.Tensor, activation: str) -> torch.Tensor:
    """Run the kernel on a checked x [..., 2I]; returns a new contiguous [..., I] tensor."""
    check_launchable(ACTIVATIONS[activation], _gated_and_mul_kernel, x)
    n_inter = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], n_inter), dtype=x.dtype, device=x.device)  # [..., I]
    if out.numel() == 0:
        return out
    x_rows = as_rows(x)  # [rows, 2I]
    n_rows = x_rows.shape[0]
    cfg = _block_config(n_inter)
    grid = (grid_blocks(n_rows, cfg["BLOCK_ROWS"]), grid_blocks(n_inter, cfg["BLOCK_COLS"]))
    _gated_and_mul_kernel[grid](
        x_rows,
        out,
        n_rows,
        n_inter,
        x_rows.stride(0),
        ACTIVATION=activation,
        BLOCK_ROWS=cfg["BLOCK_ROWS"],
        BLOCK_COLS=cfg["BLOCK_COLS"],
        num_warps=cfg["num_warps"],
        enable_fp_fusion=False,  # no FMA contraction: every multiply and add rounds like the reference's ops
    )
    return out


class _GatedAndMulFunction(torch.autograd.Function):
    """Forward: the fused kernel. Backward: the fused backward kernel (kernels/triton/swiglu_backward.py)."""

    @staticmethod
    def forward(ctx, x, activation):
        ctx.save_for_backward(x)
        ctx.activation = activation
        return _launch(x, activation)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return launch_backward(x, grad_out, activation=ctx.activation), None


def _gated_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    check_silu_and_mul_args(x, op=ACTIVATIONS[activation])
    if torch.is_grad_enabled() and x.requires_grad:
        return _GatedAndMulFunction.apply(x, activation)
    return _launch(x, activation)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Fused `silu_and_mul_reference` (SwiGLU): x [..., 2I] (gate first) -> [..., I] in x's dtype.

    Differentiable: under autograd the backward runs the fused backward kernel (see _GatedAndMulFunction).
    """
    return _gated_and_mul(x, "silu")


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Fused `gelu_tanh_and_mul_reference` (GeGLU, Gemma): x [..., 2I] (gate first) -> [..., I] in x's dtype.

    Differentiable: under autograd the backward runs the fused backward kernel (see _GatedAndMulFunction).
    """
    return _gated_and_mul(x, "gelu_tanh")
