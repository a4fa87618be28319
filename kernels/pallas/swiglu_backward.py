"""The gated activations' backward (silu_and_mul, gelu_tanh_and_mul) as one Pallas kernel (JAX). Twin of
kernels/triton/swiglu_backward.py.

The same contract, for activation dtype D, everything in float32 and rounded once (the Triton twin's docstring
says why it is PyTorch's autograd of the reference for silu, product for product, and what gelu_tanh changes),
with act(x) = x * sigmoid(z(x)) (kernels/pallas/activations.py):

    sig    = 1 / (1 + exp(-z))
    d_gate = D(((g * up) * sig) * (1 + gate * (1 - sig) * z'))     z' = 1 (silu) is never multiplied
    d_up   = D(g * (gate / (1 + exp(-z))))

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
from kernels.pallas.activations import ACTIVATIONS, gate_logit, gate_logit_slope, gated_block_config

__all__ = ["launch_backward"]

# Same sizes as the Triton twin (see there for why).
_ELEMENTS_PER_PROGRAM = 2048


def _gated_and_mul_backward_kernel(
    x_ref, d_out_ref, d_x_ref, *, activation: str, n_rows: int, n_inter: int, block_rows: int, block_cols: int
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

    denom = 1.0 + jnp.exp(-gate_logit(gate, activation))
    sig = 1.0 / denom
    slope = gate * (1.0 - sig)
    if activation != "silu":
        slope = slope * gate_logit_slope(gate)
    d_gate = g * up * sig * (1.0 + slope)  # left to right, as torch's silu_backward multiplies
    d_up = g * (gate / denom)

    dtype = d_x_ref.dtype
    plgpu.store(d_x_ref.at[row_window, pl.ds(col0, block_cols)], d_gate.astype(dtype), mask=mask)
    plgpu.store(d_x_ref.at[row_window, pl.ds(n_inter + col0, block_cols)], d_up.astype(dtype), mask=mask)


# The name docs/tutorial.md's gradient table cites for SwiGLU: the same kernel (activation="silu").
_silu_and_mul_backward_kernel = _gated_and_mul_backward_kernel


def _block_config(n_inter: int) -> dict[str, int]:
    """Block sizes for a gradient half of width `n_inter` (= I); powers of two for the GPU lowering."""
    return gated_block_config(
        n_inter, op="gated_and_mul backward", elements_per_program=_ELEMENTS_PER_PROGRAM, elements_per_warp=256
    )


def launch_backward(x: jax.Array, d_out: jax.Array, *, activation: str = "silu", interpret: bool | None) -> jax.Array:
    """d_x [..., 2I] (x's dtype) of the gated op at x [..., 2I] for the cotangent d_out [..., I].

    activation: "silu" (silu_and_mul) or "gelu_tanh" (gelu_tanh_and_mul).
    """
    op = ACTIVATIONS[activation]
    n_inter = x.shape[-1] // 2
    if d_out.shape != (*x.shape[:-1], n_inter) or d_out.dtype != x.dtype:
        raise ValueError(
            f"{op} backward: d_out is {d_out.dtype}{tuple(d_out.shape)}, expected {x.dtype}{(*x.shape[:-1], n_inter)}"
        )
    x_rows = x.reshape(-1, 2 * n_inter)  # [rows, 2I]
    n_rows = x_rows.shape[0]
    if n_rows == 0:
        return jnp.zeros(x.shape, x.dtype)
    cfg = _block_config(n_inter)
    kernel = functools.partial(
        _gated_and_mul_backward_kernel,
        activation=activation,
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
            name=f"{op}_backward",
        )

    d_out_rows = d_out.reshape(n_rows, n_inter)  # [rows, I]
    return run_on_platform(make_call, x_rows, d_out_rows, interpret=interpret).reshape(x.shape)
