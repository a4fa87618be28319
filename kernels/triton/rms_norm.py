"""Fused residual add + RMSNorm as a Triton kernel (PyTorch). Twin of kernels/pallas/rms_norm.py.

Contract and numerics: kernels/triton/reference.py::add_rms_norm_reference (docs/design.md, "The numerics contract
of add_rms_norm"), including the family options: offset (Gemma's weight applied as 1 + w) and float32_weight
(Gemma's and OLMo 2's weight multiply in float32 before the one rounding). Three layers, Liger-Kernel style:

    _add_rms_norm_kernel   @triton.jit: one program normalizes BLOCK_ROWS whole rows held in registers
    _block_config/_launch  block sizes (a pure function of the row width), checks, the launch
    add_rms_norm           the public entry point; autograd-aware (backward: kernels/triton/rms_norm_backward.py)

The residual is NOT updated in place: the new residual is a fresh tensor, like the reference and the
functional JAX twin, so that a caller's `residual` still holds its old value after the call.
Inputs may be row-strided views (read through their row stride, no copy); a non-unit stride along the last
dim is copied with `.contiguous()` first. Outputs are always contiguous.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernels.triton import MAX_BLOCK_H, as_rows, check_launchable, grid_blocks
from kernels.triton.reference import check_add_rms_norm_args, check_norm_options
from kernels.triton.rms_norm_backward import launch_backward
from kernels.triton.rounding import round_to_dtype

__all__ = ["MAX_BLOCK_H", "add_rms_norm", "round_to_dtype"]

# Rows narrower than this are packed several to a program so that small widths still fill the warps.
_ELEMENTS_PER_PROGRAM = 4096
_MAX_BLOCK_ROWS = 64


# n_rows not specialized: Triton compiles a kernel of its own for an integer argument equal to 1, and one row (a
# decode step) and many (a prompt) then cost two compilations of the same code.
@triton.jit(do_not_specialize=["n_rows"])
def _add_rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    new_residual_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    residual_row_stride,
    eps,
    offset,
    HAS_RESIDUAL: tl.constexpr,
    FLOAT32_WEIGHT: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]  # [BLOCK_ROWS, BLOCK_H]
    rows = rows.to(tl.int64)  # row * stride overflows int32 past 2**31 elements
    out_offsets = rows[:, None] * n_cols + cols[None, :]  # outputs are contiguous [rows, H]

    # Padding lanes load 0, so they add nothing to the sum of squares.
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + rows[:, None] * residual_row_stride + cols[None, :], mask=mask, other=0.0)
        # Round the sum to the activation dtype *before* normalizing: the unfused model normalizes the
        # stored (rounded) residual, and so must we to stay bit-compatible.
        s = round_to_dtype(x + r.to(tl.float32), new_residual_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + out_offsets, s, mask=mask)
        x = s.to(tl.float32)

    variance = tl.sum(x * x, axis=1) / n_cols  # [BLOCK_ROWS], true width, not BLOCK_H
    x_hat = x * tl.rsqrt(variance + eps)[:, None]  # [BLOCK_ROWS, BLOCK_H] float32
    w = tl.load(weight_ptr + cols, mask=col_ok, other=0.0).to(tl.float32) + offset  # [BLOCK_H]: offset + w
    if FLOAT32_WEIGHT:
        # Gemma 2/3, OLMo 2: the weight multiply in float32, then the one rounding.
        out = x_hat * w[None, :]
    else:
        # Qwen/Llama: round the normalized value, then multiply by offset + w in the activation dtype. The
        # reference's `offset + weight` is itself a dtype op (rounded); w + 0.0 is exact. bf16*bf16 (and
        # fp16*fp16) is exact in fp32, so one cast afterwards rounds exactly like torch's `w * normed` in D.
        w = round_to_dtype(w, out_ptr.dtype.element_ty).to(tl.float32)
        out = round_to_dtype(x_hat, out_ptr.dtype.element_ty).to(tl.float32) * w[None, :]
    tl.store(out_ptr + out_offsets, round_to_dtype(out, out_ptr.dtype.element_ty), mask=mask)


@functools.cache  # a pure function of the width, asked at every launch: shared, read only
def _block_config(n_cols: int) -> dict[str, int]:
    """Block sizes for rows of width `n_cols`: BLOCK_H covers a whole row (tl.arange needs a power of two)."""
    if n_cols < 1:
        raise ValueError(f"add_rms_norm: row width must be >= 1, got {n_cols}")
    block_h = triton.next_power_of_2(n_cols)
    if block_h > MAX_BLOCK_H:
        raise ValueError(
            f"add_rms_norm: row width {n_cols} needs a block of {block_h} elements, above the {MAX_BLOCK_H} one "
            "program can hold; use kernels='reference' for such widths"
        )
    block_rows = max(1, min(_MAX_BLOCK_ROWS, _ELEMENTS_PER_PROGRAM // block_h))
    # About 16 fp32 elements per thread, up to 32 warps (1024 threads) for the widest rows.
    num_warps = min(max(block_rows * block_h // 512, 1), 32)
    return {"BLOCK_ROWS": block_rows, "BLOCK_H": block_h, "num_warps": num_warps}


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
    float32_weight: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the kernel on checked arguments; returns (out, new_residual or None), both shaped like x."""
    check_launchable("add_rms_norm", _add_rms_norm_kernel, x, residual, weight)
    n_cols = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_residual = torch.empty_like(out) if residual is not None else None
    if out.numel() == 0:
        return out, new_residual
    x_rows = as_rows(x)  # [rows, H]
    residual_rows = as_rows(residual) if residual is not None else x_rows  # [rows, H]; unread without residual
    n_rows = x_rows.shape[0]
    cfg = _block_config(n_cols)
    grid = (grid_blocks(n_rows, cfg["BLOCK_ROWS"]),)
    _add_rms_norm_kernel[grid](
        x_rows,
        residual_rows,
        weight.contiguous(),
        out,
        new_residual if new_residual is not None else out,  # a placeholder pointer, never written
        n_rows,
        n_cols,
        x_rows.stride(0),
        residual_rows.stride(0),
        float(eps),
        float(offset),  # a runtime fp32 scalar, as the reference's Python offset becomes in its fp32 math
        HAS_RESIDUAL=residual is not None,
        FLOAT32_WEIGHT=bool(float32_weight),
        BLOCK_ROWS=cfg["BLOCK_ROWS"],
        BLOCK_H=cfg["BLOCK_H"],
        num_warps=cfg["num_warps"],
        enable_fp_fusion=False,  # no FMA contraction: every multiply and add rounds like the reference's ops
    )
    return out, new_residual


class _AddRMSNormFunction(torch.autograd.Function):
    """Forward: the fused kernel. Backward: the fused backward kernels (kernels/triton/rms_norm_backward.py).

    Saves only s (the new residual, or x without one) and the weight: the backward recomputes rstd and n
    from s, which it must read anyway, instead of keeping a per-row float32 rstd alive between the passes.
    """

    @staticmethod
    def forward(ctx, x, residual, weight, eps, offset, float32_weight):
        out, new_residual = _launch(x, residual, weight, eps, offset, float32_weight)
        ctx.eps, ctx.offset, ctx.float32_weight = eps, offset, float32_weight
        ctx.set_materialize_grads(False)  # an unused output's cotangent arrives as None: nothing to read
        ctx.save_for_backward(x if new_residual is None else new_residual, weight)
        return out if new_residual is None else (out, new_residual)

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out, d_new_residual=None):
        s, weight = ctx.saved_tensors
        if d_out is None:  # only the new residual was used: s's gradient is g_s alone, the weight gets none
            d_s, d_weight = d_new_residual, None
        else:
            d_s, d_weight = launch_backward(
                s, weight, d_out, d_new_residual, ctx.eps, offset=ctx.offset, float32_weight=ctx.float32_weight
            )
        need_x, need_residual, need_weight = ctx.needs_input_grad[:3]
        # s = x + residual: both receive d_s itself (autograd adds into buffers out of place, never aliasing).
        # d(offset + w)/dw = 1: the weight's gradient is that of offset + w.
        d_weight = d_weight if need_weight else None
        return d_s if need_x else None, d_s if need_residual else None, d_weight, None, None, None


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    offset: float = 0.0,
    float32_weight: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Fused `add_rms_norm_reference`: returns out, or (out, new_residual) when `residual` is given.

    x: [..., H] float32/bfloat16/float16; residual: like x or None; weight: [H], x's dtype; eps > 0.
    offset: the weight is applied as offset + weight (Gemma: 1.0); float32_weight: the weight multiply in
    float32 before the one rounding (Gemma 2/3, OLMo 2) instead of in the dtype after it (Qwen, Llama).
    Differentiable: under autograd the backward runs the fused backward kernels (see _AddRMSNormFunction).
    """
    check_add_rms_norm_args(x, residual, weight, eps)
    check_norm_options(offset, float32_weight)
    offset, float32_weight = float(offset), bool(float32_weight)
    tensors = (x, residual, weight)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return _AddRMSNormFunction.apply(x, residual, weight, eps, offset, float32_weight)
    out, new_residual = _launch(x, residual, weight, eps, offset, float32_weight)
    return out if new_residual is None else (out, new_residual)
