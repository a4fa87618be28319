"""SwiGLU's activation, silu(gate) * up on a merged [..., 2I] input, as a Pallas kernel (JAX).
Twin of kernels/triton/swiglu.py.

Contract and numerics: kernels/pallas/reference.py::silu_and_mul_reference (gate is the first half, up the
second; computed in fp32, cast to the activation dtype once). Three layers, like the Triton twin:

    _silu_and_mul_kernel   Pallas kernel: one program computes a [BLOCK_ROWS, BLOCK_COLS] tile of the output
    _block_config/_launch  block sizes (a pure function of I), the pallas_call
    silu_and_mul           the public entry point; jax.custom_vjp (backward: kernels/pallas/swiglu_backward.py)

Elementwise, so the columns are tiled too: any I works, with no cap on the width. The refs are whole
arrays addressed with pl.ds and masks, as in kernels/pallas/rms_norm.py (see there for why).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.pallas import INTERPRET_COMPILER_OPTIONS, resolve_interpret, run_on_platform
from kernels.pallas.reference import check_silu_and_mul_args
from kernels.pallas.swiglu_backward import launch_backward

__all__ = ["silu_and_mul"]

_MAX_BLOCK_COLS = 1024
_ELEMENTS_PER_PROGRAM = 4096


def _silu_and_mul_kernel(x_ref, out_ref, *, n_rows: int, n_inter: int, block_rows: int, block_cols: int) -> None:
    row0 = pl.program_id(0) * block_rows
    col0 = pl.program_id(1) * block_cols
    rows = row0 + jnp.arange(block_rows)
    cols = col0 + jnp.arange(block_cols)
    mask = (rows < n_rows)[:, None] & (cols < n_inter)[None, :]  # [BLOCK_ROWS, BLOCK_COLS]

    gate = plgpu.load(x_ref.at[pl.ds(row0, block_rows), pl.ds(col0, block_cols)], mask=mask, other=0.0)
    # up starts I columns later in the same row
    up = plgpu.load(x_ref.at[pl.ds(row0, block_rows), pl.ds(n_inter + col0, block_cols)], mask=mask, other=0.0)
    gate, up = gate.astype(jnp.float32), up.astype(jnp.float32)
    # x / (1 + exp(-x)) is the formula torch's silu uses; sigmoid(x) * x would round differently.
    out = gate / (1.0 + jnp.exp(-gate)) * up
    plgpu.store(out_ref.at[pl.ds(row0, block_rows), pl.ds(col0, block_cols)], out.astype(out_ref.dtype), mask=mask)


def _block_config(n_inter: int) -> dict[str, int]:
    """Block sizes for an output row of width `n_inter` (= I); powers of two for the GPU lowering."""
    if n_inter < 1:
        raise ValueError(f"silu_and_mul: output width must be >= 1, got {n_inter}")
    block_cols = min(pl.next_power_of_2(n_inter), _MAX_BLOCK_COLS)
    block_rows = _ELEMENTS_PER_PROGRAM // block_cols
    num_warps = min(max(block_rows * block_cols // 512, 1), 8)
    return {"BLOCK_ROWS": block_rows, "BLOCK_COLS": block_cols, "num_warps": num_warps}


def _launch(x: jax.Array, *, interpret: bool | None) -> jax.Array:
    """Run the kernel on a checked x [..., 2I]; returns [..., I]."""
    n_inter = x.shape[-1] // 2
    x_rows = x.reshape(-1, 2 * n_inter)  # [rows, 2I]
    n_rows = x_rows.shape[0]
    out_shape = (*x.shape[:-1], n_inter)  # [..., I]
    if n_rows == 0:
        return jnp.zeros(out_shape, x.dtype)
    cfg = _block_config(n_inter)
    kernel = functools.partial(
        _silu_and_mul_kernel,
        n_rows=n_rows,
        n_inter=n_inter,
        block_rows=cfg["BLOCK_ROWS"],
        block_cols=cfg["BLOCK_COLS"],
    )

    def make_call(interpret_now: bool):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((n_rows, n_inter), x.dtype),  # [rows, I]
            grid=(pl.cdiv(n_rows, cfg["BLOCK_ROWS"]), pl.cdiv(n_inter, cfg["BLOCK_COLS"])),
            compiler_params=plgpu.CompilerParams(num_warps=cfg["num_warps"]),
            interpret=interpret_now,
            name="silu_and_mul",
        )

    return run_on_platform(make_call, x_rows, interpret=interpret).reshape(out_shape)


_launch_jit = jax.jit(_launch, static_argnames=("interpret",))
_launch_interpreted = jax.jit(functools.partial(_launch, interpret=True), compiler_options=INTERPRET_COMPILER_OPTIONS)
_backward_jit = jax.jit(launch_backward, static_argnames=("interpret",))
_backward_interpreted = jax.jit(
    functools.partial(launch_backward, interpret=True), compiler_options=INTERPRET_COMPILER_OPTIONS
)


def _run(x, interpret):
    return _launch_interpreted(x) if interpret else _launch_jit(x, interpret=interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _silu_and_mul(x, interpret):
    return _run(x, interpret)


def _silu_and_mul_fwd(x, interpret):
    return _run(x, interpret), x


def _silu_and_mul_bwd(interpret, x, cotangent):
    if interpret:
        return (_backward_interpreted(x, cotangent),)
    return (_backward_jit(x, cotangent, interpret=interpret),)


_silu_and_mul.defvjp(_silu_and_mul_fwd, _silu_and_mul_bwd)


def silu_and_mul(x: jax.Array, *, interpret: bool | None = None) -> jax.Array:
    """Fused `silu_and_mul_reference`: x [..., 2I] (gate first) -> [..., I] in x's dtype.

    interpret: None (default) interprets on CPU and compiles on GPU, judged from x's device (or, inside
    jax.jit, from the platform being compiled for); True/False forces one or the other.
    Differentiable (jax.grad/vjp): the backward runs the fused backward kernel (swiglu_backward.py).
    """
    check_silu_and_mul_args(x)
    return _silu_and_mul(x, resolve_interpret(x, interpret))
