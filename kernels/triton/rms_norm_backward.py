"""add_rms_norm's backward as Triton kernels (PyTorch). Twin of kernels/pallas/rms_norm_backward.py.

The forward (kernels/triton/rms_norm.py) returns out = D(f32(n) * f32(w)), n = D(f32(s) * rstd), and the new
residual s = D(f32(x) + f32(residual)) (docs/design.md, "The numerics contract of add_rms_norm"). Given the
cotangents g of out and g_s of s, this computes, for activation dtype D:

    rstd = rsqrt(mean(f32(s)^2) + eps)             recomputed exactly as the forward does (no saved rstd)
    n    = D(f32(s) * rstd)                        the forward's rounded normalized value, recomputed
    dy   = f32(D(f32(g) * f32(w)))                 the gradient reaching n: the weight multiply in D, rounded
    c    = mean(dy * f32(s))                       float32, per row: the RMS is not a constant
    d_s  = D(rstd * (dy - f32(s) * rstd^2 * c))    float32, rounded once
    d_s  = D(f32(d_s) + f32(g_s))                  only when there is a residual: the two uses of s add in D
    d_w  = D(sum over rows of f32(D(f32(g) * f32(n))))  per-row products rounded in D, summed in float32

and d_x = d_residual = d_s (s = x + residual). These are the rounding points PyTorch's autograd of the
unfused reference has, so a fused bf16 model trains like the unfused one; in float32 every rounding is
the identity and only summation order differs.

The family options (Gemma, OLMo 2) change only the weight's two lines. offset: the forward applies
w' = D(offset + f32(w)) (a dtype add in the reference), so w' replaces w above; d(offset + w)/dw = 1, so d_w
is d_w' unchanged. float32_weight: the forward is out = D(x_hat * (offset + f32(w))), x_hat = f32(s) * rstd
unrounded, the multiply in float32 before the one cast, so autograd's products are float32 too:

    dy   = f32(g) * (offset + f32(w))                  no rounding (replaces D(f32(g) * f32(w)))
    d_w  = D(sum over rows of f32(g) * x_hat)          no per-row rounding (replaces the D(g * n) terms)

and c, d_s as above from this dy.

The weight gradient is a reduction over rows with no atomics, so it is the same bits on every run: each
program of _add_rms_norm_backward_kernel handles a fixed, contiguous run of row blocks and writes its float32
partial sum as one row of a [n_programs, H] buffer; _sum_partials_kernel then adds those rows in program order
and rounds once. How many programs there are is a pure function of the shape (not of the GPU), so the
reduction order, and hence the bits, are the same on every device too.

Three layers, as in the forward: the @triton.jit kernels; _block_config/launch_backward (checks, block
sizes, the launches); the torch.autograd.Function in rms_norm.py is the wrapper.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.triton import MAX_BLOCK_H, as_rows, check_launchable, grid_blocks
from kernels.triton.rounding import round_to_dtype

__all__ = ["launch_backward"]

# The backward holds about twice the forward's live row tiles (s, g, dy, n, d_s), so half its rows per block.
_ELEMENTS_PER_PROGRAM = 2048
_MAX_BLOCK_ROWS = 64
# At most this many partial dW rows ([n_programs, H] float32): enough programs to fill a GPU, a bounded buffer.
_MAX_PROGRAMS = 256
_SUM_BLOCK_COLS = 1024


@triton.jit
def _add_rms_norm_backward_kernel(
    s_ptr,
    weight_ptr,
    d_out_ptr,
    d_new_residual_ptr,
    d_s_ptr,
    partial_dw_ptr,
    n_rows,
    n_cols,
    s_row_stride,
    d_out_row_stride,
    d_new_residual_row_stride,
    eps,
    offset,
    blocks_per_program,
    HAS_D_NEW_RESIDUAL: tl.constexpr,
    FLOAT32_WEIGHT: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    dtype = d_s_ptr.dtype.element_ty
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < n_cols
    w = tl.load(weight_ptr + cols, mask=col_ok, other=0.0).to(tl.float32) + offset  # [BLOCK_H]: offset + w
    if not FLOAT32_WEIGHT:
        w = round_to_dtype(w, dtype).to(tl.float32)  # the forward's D(offset + w); exact for offset 0
    dw = tl.zeros((BLOCK_H,), dtype=tl.float32)  # this program's partial sum over its rows
    for block in range(0, blocks_per_program):
        rows = (pid * blocks_per_program + block) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        mask = (rows < n_rows)[:, None] & col_ok[None, :]  # [BLOCK_ROWS, BLOCK_H]
        rows = rows.to(tl.int64)  # row * stride overflows int32 past 2**31 elements
        # Padding lanes and rows load 0: they add nothing to any sum below.
        s = tl.load(s_ptr + rows[:, None] * s_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(d_out_ptr + rows[:, None] * d_out_row_stride + cols[None, :], mask=mask, other=0.0)
        g = g.to(tl.float32)

        rstd = tl.rsqrt(tl.sum(s * s, axis=1) / n_cols + eps)  # [BLOCK_ROWS], the forward's expression
        x_hat = s * rstd[:, None]  # [BLOCK_ROWS, BLOCK_H] float32
        if FLOAT32_WEIGHT:
            # The forward multiplied in float32 before its one rounding: no rounding in either product.
            dw += tl.sum(g * x_hat, axis=0)
            dy = g * w[None, :]  # d x_hat, float32
        else:
            n = round_to_dtype(x_hat, dtype).to(tl.float32)  # the forward's n, bit for bit
            # d_w: products rounded in D (as autograd's D multiply), summed in float32.
            dw += tl.sum(round_to_dtype(g * n, dtype).to(tl.float32), axis=0)
            dy = round_to_dtype(g * w[None, :], dtype).to(tl.float32)  # d n, rounded in D
        c = tl.sum(dy * s, axis=1) / n_cols  # [BLOCK_ROWS]: mean(dy * s), the RMS's own gradient
        d_s = rstd[:, None] * (dy - s * (rstd * rstd * c)[:, None])
        if HAS_D_NEW_RESIDUAL:
            g_s = tl.load(
                d_new_residual_ptr + rows[:, None] * d_new_residual_row_stride + cols[None, :], mask=mask, other=0.0
            )
            d_s = round_to_dtype(d_s, dtype).to(tl.float32) + g_s.to(tl.float32)
        tl.store(d_s_ptr + rows[:, None] * n_cols + cols[None, :], round_to_dtype(d_s, dtype), mask=mask)
    tl.store(partial_dw_ptr + pid * n_cols + cols, dw, mask=col_ok)


@triton.jit
def _sum_partials_kernel(partial_ptr, out_ptr, n_partials, n_cols, BLOCK_COLS: tl.constexpr):
    """out[j] = D(sum_p partial[p, j]), added in program order p = 0, 1, ...: one fixed order, no atomics."""
    cols = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_ok = cols < n_cols
    acc = tl.zeros((BLOCK_COLS,), dtype=tl.float32)
    for p in range(0, n_partials):
        acc += tl.load(partial_ptr + p * n_cols + cols, mask=col_ok, other=0.0)
    tl.store(out_ptr + cols, round_to_dtype(acc, out_ptr.dtype.element_ty), mask=col_ok)


@functools.lru_cache(maxsize=1024)  # asked at every launch: shared, read only
def _block_config(n_rows: int, n_cols: int) -> dict[str, int]:
    """Block sizes and program count, a pure function of the shape (so the dW reduction order is too)."""
    if n_cols < 1:
        raise ValueError(f"add_rms_norm backward: row width must be >= 1, got {n_cols}")
    block_h = triton.next_power_of_2(n_cols)
    if block_h > MAX_BLOCK_H:
        raise ValueError(f"add_rms_norm backward: row width {n_cols} is wider than one program holds")
    block_rows = max(1, min(_MAX_BLOCK_ROWS, _ELEMENTS_PER_PROGRAM // block_h))
    row_blocks = triton.cdiv(n_rows, block_rows)
    blocks_per_program = max(1, triton.cdiv(row_blocks, _MAX_PROGRAMS))
    return {
        "BLOCK_ROWS": block_rows,
        "BLOCK_H": block_h,
        "num_warps": min(max(block_rows * block_h // 256, 1), 32),  # ~8 fp32 elements per thread and tile
        "blocks_per_program": blocks_per_program,
        "n_programs": max(1, triton.cdiv(row_blocks, blocks_per_program)),
    }


def launch_backward(
    s: torch.Tensor,
    weight: torch.Tensor,
    d_out: torch.Tensor,
    d_new_residual: torch.Tensor | None,
    eps: float,
    *,
    offset: float = 0.0,
    float32_weight: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_s, d_weight) of add_rms_norm, from the normalized input s (the new residual, or x) and the cotangents.

    s, d_out: [..., H]; weight: [H]; d_new_residual: like s, or None (no residual, or the new residual unused).
    offset, float32_weight: the forward's (see the module docstring for where each moves a rounding).
    Returns d_s shaped like s (contiguous) and d_weight [H], both in s's dtype.
    """
    for name, t in (("d_out", d_out), ("d_new_residual", d_new_residual)):
        if t is not None and (t.shape != s.shape or t.dtype != s.dtype):
            raise ValueError(
                f"add_rms_norm backward: {name} is {t.dtype}{tuple(t.shape)}, s is {s.dtype}{tuple(s.shape)}"
            )
    if weight.shape != s.shape[-1:] or weight.dtype != s.dtype:
        raise ValueError(f"add_rms_norm backward: weight is {weight.dtype}{tuple(weight.shape)}, s is {s.dtype}")
    check_launchable("add_rms_norm backward", _add_rms_norm_backward_kernel, s, weight, d_out, d_new_residual)
    n_cols = s.shape[-1]
    d_s = torch.empty(s.shape, dtype=s.dtype, device=s.device)
    if s.numel() == 0:
        return d_s, torch.zeros_like(weight)
    s_rows, d_out_rows = as_rows(s), as_rows(d_out)  # [rows, H]
    g_s_rows = as_rows(d_new_residual) if d_new_residual is not None else d_out_rows  # unread without one
    cfg = _block_config(s_rows.shape[0], n_cols)
    partial_dw = torch.empty((cfg["n_programs"], n_cols), dtype=torch.float32, device=s.device)  # [programs, H]
    _add_rms_norm_backward_kernel[(cfg["n_programs"],)](
        s_rows,
        weight.contiguous(),
        d_out_rows,
        g_s_rows,
        d_s,
        partial_dw,
        s_rows.shape[0],
        n_cols,
        s_rows.stride(0),
        d_out_rows.stride(0),
        g_s_rows.stride(0),
        float(eps),
        float(offset),
        cfg["blocks_per_program"],
        HAS_D_NEW_RESIDUAL=d_new_residual is not None,
        FLOAT32_WEIGHT=bool(float32_weight),
        BLOCK_ROWS=cfg["BLOCK_ROWS"],
        BLOCK_H=cfg["BLOCK_H"],
        num_warps=cfg["num_warps"],
        enable_fp_fusion=False,  # no FMA contraction: each multiply and add rounds as the reference's ops do
    )
    d_weight = torch.empty_like(weight, memory_format=torch.contiguous_format)
    _sum_partials_kernel[(grid_blocks(n_cols, _SUM_BLOCK_COLS),)](
        partial_dw, d_weight, cfg["n_programs"], n_cols, BLOCK_COLS=_SUM_BLOCK_COLS, enable_fp_fusion=False
    )
    return d_s, d_weight
