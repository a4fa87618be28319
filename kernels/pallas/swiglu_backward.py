"""silu_and_mul's backward as a Pallas kernel (JAX). Twin of kernels/triton/swiglu_backward.py.

The same contract, for activation dtype D, everything in float32 and rounded once (the Triton twin's docstring
says why it is PyTorch's autograd of the reference, product for product):

    sig    = 1 / (1 + exp(-gate))
    d_gate = D(((g * up) * sig) * (1 + gate * (1 - sig)))
    d_up   = D(g * (gate / (1 + exp(-gate))))

written into one [..., 2I] gradient, gate half first. Three layers: the Pallas kernel; _block_config (the Triton
twin's tiling) and launch_backward; the jax.custom_vjp in swiglu.py is the wrapper.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.pallas import run_on_platform

__all__ = ["launch_backward"]

# Same sizes as the Triton twin (see there for why).
_MAX_BLOCK_COLS = 1024
_ELEMENTS_PER_PROGRAM = 2048


def _silu_and_mul_backward_kernel(
    x_ref, d_out_ref, d_x_ref, *, n_rows: int, n_inter: int, block_rows: int, block_cols: int
) -> None:
    row0 = pl.program_id(0) * block_rows
    col0 = pl.program_id(1) * block_cols
    rows = row0 + jnp.arange(block_rows)
    cols = col0 + jnp.arange(block_cols)
    mask = (rows < n_rows)[:, None] & (cols < n_inter)[None, :]  # [BLOCK_ROWS, BLOCK_COLS]
    row_window = pl.ds(row0, block_rows)

    gate = plgpu.load(x_ref.at[row_window, pl.ds(col0, block_cols)], mask=mask, other=0.0).astype(jnp.float32)
    # up starts I columns later in the same row
    up = plgpu.load(x_ref.at[row_window, pl.ds(n_inter + col0, block_cols)], mask=mask, other=0.0)
    g = plgpu.load(d_out_ref.at[row_window, pl.ds(col0, block_cols)], mask=mask, other=0.0).astype(jnp.float32)
    up = up.astype(jnp.float32)

    denom = 1.0 + jnp.exp(-gate)
    sig = 1.0 / denom
    d_gate = g * up * sig * (1.0 + gate * (1.0 - sig))  # left to right, as torch's silu_backward multiplies
    d_up = g * (gate / denom)

    dtype = d_x_ref.dtype
    plgpu.store(d_x_ref.at[row_window, pl.ds(col0, block_cols)], d_gate.astype(dtype), mask=mask)
    plgpu.store(d_x_ref.at[row_window, pl.ds(n_inter + col0, block_cols)], d_up.astype(dtype), mask=mask)


def _block_config(n_inter: int) -> dict[str, int]:
    """Block sizes for a gradient half of width `n_inter` (= I); powers of two for the GPU lowering."""
    if n_inter < 1:
        raise ValueError(f"silu_and_mul backward: width must be >= 1, got {n_inter}")
    block_cols = min(pl.next_power_of_2(n_inter), _MAX_BLOCK_COLS)
    block_rows = max(1, _ELEMENTS_PER_PROGRAM // block_cols)
    num_warps = min(max(block_rows * block_cols // 256, 1), 8)
    return {"BLOCK_ROWS": block_rows, "BLOCK_COLS": block_cols, "num_warps": num_warps}


def launch_backward(x: jax.Array, d_out: jax.Array, *, interpret: bool | None) -> jax.Array:
    """d_x [..., 2I] (x's dtype) of silu_and_mul at x [..., 2I] for the cotangent d_out [..., I]."""
    n_inter = x.shape[-1] // 2
    if d_out.shape != (*x.shape[:-1], n_inter) or d_out.dtype != x.dtype:
        raise ValueError(
            f"silu_and_mul backward: d_out is {d_out.dtype}{tuple(d_out.shape)}, expected {x.dtype}"
            f"{(*x.shape[:-1], n_inter)}"
        )
    x_rows = x.reshape(-1, 2 * n_inter)  # [rows, 2I]
    n_rows = x_rows.shape[0]
    if n_rows == 0:
        return jnp.zeros(x.shape, x.dtype)
    cfg = _block_config(n_inter)
    kernel = functools.partial(
        _silu_and_mul_backward_kernel,
        n_rows=n_rows,
        n_inter=n_inter,
        block_rows=cfg["BLOCK_ROWS"],
        block_cols=cfg["BLOCK_COLS"],
    )

    def make_call(interpret_now: bool):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x_rows.shape, x.dtype),  # [rows, 2I]
            grid=(pl.cdiv(n_rows, cfg["BLOCK_ROWS"]), pl.cdiv(n_inter, cfg["BLOCK_COLS"])),
            # x (input 0) and d_x (output 0) may share a buffer: each program reads its tile of gate and up
            # before it writes the same tile of d_gate and d_up.
            input_output_aliases={0: 0},
            compiler_params=plgpu.CompilerParams(num_warps=cfg["num_warps"]),
            interpret=interpret_now,
            name="silu_and_mul_backward",
        )

    d_out_rows = d_out.reshape(n_rows, n_inter)  # [rows, I]
    return run_on_platform(make_call, x_rows, d_out_rows, interpret=interpret).reshape(x.shape)
