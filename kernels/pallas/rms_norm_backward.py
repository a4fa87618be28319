"""add_rms_norm's backward as Pallas kernels (JAX). Twin of kernels/triton/rms_norm_backward.py.

The same contract, for activation dtype D (the Triton twin's docstring derives it; docs/design.md, "The
numerics contract of add_rms_norm", states it):

    rstd = rsqrt(mean(f32(s)^2) + eps);  n = D(f32(s) * rstd)     recomputed as the forward computes them
    dy   = f32(D(f32(g) * f32(w)));      c = mean(dy * f32(s))    float32; the RMS is not a constant
    d_s  = D(rstd * (dy - f32(s) * rstd^2 * c)), then D(f32(d_s) + f32(g_s)) with a residual
    d_w  = D(sum over rows of f32(D(f32(g) * f32(n))))

with d_x = d_residual = d_s. The family options: offset replaces w by D(offset + f32(w)) (d_w unchanged:
d(offset + w)/dw = 1); float32_weight drops the two weight roundings, dy = f32(g) * (offset + f32(w)) and
d_w = D(sum over rows of f32(g) * f32(s) * rstd), as the forward then multiplies in float32.

The weight gradient is reduced without atomics: each program writes the float32 partial sum of its fixed run of
row blocks as one row of a [n_programs, H] buffer, and _sum_partials_kernel adds the rows in program order, then
rounds once -- the same bits on every run and every device. The block configuration is the Triton twin's
(tests/kernels/test_cross_kernels.py checks it).

Three layers: the Pallas kernels; _block_config/launch_backward (the pallas_calls); the jax.custom_vjp in
rms_norm.py is the wrapper. Refs are whole arrays addressed with pl.ds and masks, as in the forward.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.pallas import MAX_BLOCK_H, run_on_platform

__all__ = ["launch_backward"]

# Same sizes as the Triton twin (see there for why).
_ELEMENTS_PER_PROGRAM = 2048
_MAX_BLOCK_ROWS = 64
_MAX_PROGRAMS = 256
_SUM_BLOCK_COLS = 1024


def _add_rms_norm_backward_kernel(
    *refs,
    n_rows: int,
    n_cols: int,
    eps: float,
    offset: float,
    float32_weight: bool,
    block_rows: int,
    block_h: int,
    blocks_per_program: int,
) -> None:
    if len(refs) == 6:
        s_ref, weight_ref, d_out_ref, d_new_residual_ref, d_s_ref, partial_ref = refs
    else:
        (s_ref, weight_ref, d_out_ref, d_s_ref, partial_ref), d_new_residual_ref = refs, None
    dtype = d_s_ref.dtype
    pid = pl.program_id(0)
    cols = jnp.arange(block_h)
    col_ok = cols < n_cols
    w = plgpu.load(weight_ref.at[pl.ds(0, block_h)], mask=col_ok, other=0.0)  # [BLOCK_H]
    w = w.astype(jnp.float32) + jnp.float32(offset)  # offset + w
    if not float32_weight:
        w = w.astype(dtype).astype(jnp.float32)  # the forward's D(offset + w); exact for offset 0

    def one_block(block: jax.Array, dw: jax.Array) -> jax.Array:
        row0 = (pid * blocks_per_program + block) * block_rows
        rows = row0 + jnp.arange(block_rows)
        mask = (rows < n_rows)[:, None] & col_ok[None, :]  # [BLOCK_ROWS, BLOCK_H]
        window = (pl.ds(row0, block_rows), pl.ds(0, block_h))  # may overhang the array: masked
        # Padding lanes and rows load 0: they add nothing to any sum below.
        s = plgpu.load(s_ref.at[window], mask=mask, other=0.0).astype(jnp.float32)
        g = plgpu.load(d_out_ref.at[window], mask=mask, other=0.0).astype(jnp.float32)

        variance = jnp.sum(s * s, axis=1, keepdims=True) / n_cols  # [BLOCK_ROWS, 1], the forward's expression
        rstd = lax.rsqrt(variance + eps)
        x_hat = s * rstd  # [BLOCK_ROWS, BLOCK_H] float32
        if float32_weight:
            # The forward multiplied in float32 before its one rounding: no rounding in either product.
            dw = dw + jnp.sum(g * x_hat, axis=0)
            dy = g * w[None, :]  # d x_hat, float32
        else:
            n = x_hat.astype(dtype).astype(jnp.float32)  # the forward's n, bit for bit
            # d_w: products rounded in D (as autograd's D multiply), summed in float32.
            dw = dw + jnp.sum((g * n).astype(dtype).astype(jnp.float32), axis=0)
            dy = (g * w[None, :]).astype(dtype).astype(jnp.float32)  # d n, rounded in D
        c = jnp.sum(dy * s, axis=1, keepdims=True) / n_cols  # [BLOCK_ROWS, 1]: the RMS's own gradient
        d_s = rstd * (dy - s * (rstd * rstd * c))
        if d_new_residual_ref is not None:
            g_s = plgpu.load(d_new_residual_ref.at[window], mask=mask, other=0.0)
            d_s = d_s.astype(dtype).astype(jnp.float32) + g_s.astype(jnp.float32)
        plgpu.store(d_s_ref.at[window], d_s.astype(dtype), mask=mask)
        return dw

    dw = jnp.zeros((block_h,), jnp.float32)
    # One block per program (any shape under _MAX_PROGRAMS row blocks) needs no loop: a smaller program, which
    # halves the XLA compile of the interpreted kernel.
    dw = one_block(0, dw) if blocks_per_program == 1 else lax.fori_loop(0, blocks_per_program, one_block, dw)
    plgpu.store(partial_ref.at[pl.ds(pid, 1), pl.ds(0, block_h)], dw[None, :], mask=col_ok[None, :])


def _sum_partials_kernel(partial_ref, out_ref, *, n_partials: int, n_cols: int) -> None:
    """out[j] = D(sum_p partial[p, j]), added in program order p = 0, 1, ...: one fixed order, no atomics."""
    col0 = pl.program_id(0) * _SUM_BLOCK_COLS
    col_ok = col0 + jnp.arange(_SUM_BLOCK_COLS) < n_cols

    def add_row(p: jax.Array, acc: jax.Array) -> jax.Array:
        row = plgpu.load(partial_ref.at[pl.ds(p, 1), pl.ds(col0, _SUM_BLOCK_COLS)], mask=col_ok[None, :], other=0.0)
        return acc + row[0]

    acc = lax.fori_loop(0, n_partials, add_row, jnp.zeros((_SUM_BLOCK_COLS,), jnp.float32))
    plgpu.store(out_ref.at[pl.ds(col0, _SUM_BLOCK_COLS)], acc.astype(out_ref.dtype), mask=col_ok)


def _block_config(n_rows: int, n_cols: int) -> dict[str, int]:
    """Block sizes and program count, a pure function of the shape (so the dW reduction order is too)."""
    if n_cols < 1:
        raise ValueError(f"add_rms_norm backward: row width must be >= 1, got {n_cols}")
    block_h = pl.next_power_of_2(n_cols)
    if block_h > MAX_BLOCK_H:
        raise ValueError(f"add_rms_norm backward: row width {n_cols} is wider than one program holds")
    block_rows = max(1, min(_MAX_BLOCK_ROWS, _ELEMENTS_PER_PROGRAM // block_h))
    row_blocks = pl.cdiv(n_rows, block_rows)
    blocks_per_program = max(1, pl.cdiv(row_blocks, _MAX_PROGRAMS))
    return {
        "BLOCK_ROWS": block_rows,
        "BLOCK_H": block_h,
        "num_warps": min(max(block_rows * block_h // 256, 1), 32),  # ~8 fp32 elements per thread and tile
        "blocks_per_program": blocks_per_program,
        "n_programs": max(1, pl.cdiv(row_blocks, blocks_per_program)),
    }


def launch_backward(
    s: jax.Array,
    weight: jax.Array,
    d_out: jax.Array,
    d_new_residual: jax.Array | None,
    *,
    eps: float,
    offset: float = 0.0,
    float32_weight: bool = False,
    interpret: bool | None,
) -> tuple[jax.Array, jax.Array]:
    """(d_s, d_weight) of add_rms_norm from the normalized input s (the new residual, or x) and the cotangents.

    s, d_out, d_new_residual (None: no residual output): [..., H] in one dtype; weight: [H]. Returns d_s shaped
    like s and d_weight [H], in s's dtype. offset, float32_weight: the forward's (the Triton twin's docstring
    derives where each moves a rounding).
    """
    for name, t in (("d_out", d_out), ("d_new_residual", d_new_residual)):
        if t is not None and (t.shape != s.shape or t.dtype != s.dtype):
            raise ValueError(
                f"add_rms_norm backward: {name} is {t.dtype}{tuple(t.shape)}, s is {s.dtype}{tuple(s.shape)}"
            )
    n_cols = s.shape[-1]
    s_rows = s.reshape(-1, n_cols)  # [rows, H]
    n_rows = s_rows.shape[0]
    if n_rows == 0:
        return s, jnp.zeros_like(weight)
    cfg = _block_config(n_rows, n_cols)
    rows = (s_rows, weight, d_out.reshape(-1, n_cols))  # [rows, H], [H], [rows, H]
    if d_new_residual is not None:
        rows = (*rows, d_new_residual.reshape(-1, n_cols))  # [rows, H]
    kernel = functools.partial(
        _add_rms_norm_backward_kernel,
        n_rows=n_rows,
        n_cols=n_cols,
        eps=eps,
        offset=offset,
        float32_weight=float32_weight,
        block_rows=cfg["BLOCK_ROWS"],
        block_h=cfg["BLOCK_H"],
        blocks_per_program=cfg["blocks_per_program"],
    )
    partial_shape = jax.ShapeDtypeStruct((cfg["n_programs"], n_cols), jnp.float32)  # [programs, H]

    def make_backward(interpret_now: bool):
        return pl.pallas_call(
            kernel,
            out_shape=(jax.ShapeDtypeStruct(s_rows.shape, s.dtype), partial_shape),
            grid=(cfg["n_programs"],),
            # d_out (input 2) and d_s (output 0) may share a buffer: each program reads its rows of d_out
            # before it writes those rows of d_s.
            input_output_aliases={2: 0},
            compiler_params=plgpu.CompilerParams(num_warps=cfg["num_warps"]),
            interpret=interpret_now,
            name="add_rms_norm_backward",
        )

    def make_sum(interpret_now: bool):
        return pl.pallas_call(
            functools.partial(_sum_partials_kernel, n_partials=cfg["n_programs"], n_cols=n_cols),
            out_shape=jax.ShapeDtypeStruct(weight.shape, weight.dtype),
            grid=(pl.cdiv(n_cols, _SUM_BLOCK_COLS),),
            # The Triton lowering, like every kernel here (without Triton's params Pallas picks Mosaic GPU).
            compiler_params=plgpu.CompilerParams(num_warps=4),
            interpret=interpret_now,
            name="add_rms_norm_backward_sum_dw",
        )

    d_s, partial_dw = run_on_platform(make_backward, *rows, interpret=interpret)
    d_weight = run_on_platform(make_sum, partial_dw, interpret=interpret)
    return d_s.reshape(s.shape), d_weight
