"""The gated MLP activations, act(gate) * up on a merged [..., 2I] input, as one Pallas kernel (JAX): SwiGLU's
silu (`silu_and_mul`) and GeGLU's tanh-approximated GELU (`gelu_tanh_and_mul`, Gemma). Twin of
kernels/triton/swiglu.py; the module keeps SwiGLU's name, which the docs cite.

Contracts and numerics: kernels/pallas/reference.py::silu_and_mul_reference / gelu_tanh_and_mul_reference (gate
is the first half, up the second; computed in fp32, cast to the activation dtype once). The activation is a
static choice of one kernel (kernels/pallas/activations.py). Three layers, like the Triton twin:

    _gated_and_mul_kernel   Pallas kernel: one program computes a [BLOCK_ROWS, BLOCK_COLS] tile of the output
    _block_config/_launch   block sizes (a pure function of I), the pallas_call
    silu_and_mul, gelu_tanh_and_mul
                            the public entry points; jax.custom_vjp (backward: kernels/pallas/swiglu_backward.py)

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
from kernels.pallas.activations import ACTIVATIONS, gate_logit, gated_block_config
from kernels.pallas.reference import check_silu_and_mul_args
from kernels.pallas.swiglu_backward import launch_backward

__all__ = ["gelu_tanh_and_mul", "silu_and_mul"]

_ELEMENTS_PER_PROGRAM = 4096


def _gated_and_mul_kernel(
    x_ref, out_ref, *, activation: str, n_rows: int, n_inter: int, block_rows: int, block_cols: int
) -> None:
    row0 = pl.program_id(0) * block_rows
    col0 = pl.program_id(1) * block_cols
    rows = row0 + jnp.arange(block_rows)
    cols = col0 + jnp.arange(block_cols)
    mask = (rows < n_rows)[:, None] & (cols < n_inter)[None, :]  # [BLOCK_ROWS, BLOCK_COLS]

    gate = plgpu.load(x_ref.at[pl.ds(row0, block_rows), pl.ds(col0, block_cols)], mask=mask, other=0.0)
    # up starts I columns later in the same row
    up = plgpu.load(x_ref.at[pl.ds(row0, block_rows), pl.ds(n_inter + col0, block_cols)], mask=mask, other=0.0)
    gate, up = gate.astype(jnp.float32), up.astype(jnp.float32)
    # x / (1 + exp(-z)): for silu (z = x) the formula torch's silu uses; sigmoid(x) * x would round differently.
    out = gate / (1.0 + jnp.exp(-gate_logit(gate, activation))) * up
    plgpu.store(out_ref.at[pl.ds(row0, block_rows), pl.ds(col0, block_cols)], out.astype(out_ref.dtype), mask=mask)


def _block_config(n_inter: int) -> dict[str, int]:
    """Block sizes for an output row of width `n_inter` (= I); powers of two for the GPU lowering."""
    return gated_block_config(
        n_inter, op="gated_and_mul", elements_per_program=_ELEMENTS_PER_PROGRAM, elements_per_warp=512
    )


def _launch(x: jax.Array, *, activation: str, interpret: bool | None) -> jax.Array:
    """Run the kernel on a checked x [..., 2I]; returns [..., I]."""
    n_inter = x.shape[-1] // 2
    x_rows = x.reshape(-1, 2 * n_inter)  # [rows, 2I]
    n_rows = x_rows.shape[0]
    out_shape = (*x.shape[:-1], n_inter)  # [..., I]
    if n_rows == 0:
        return jnp.zeros(out_shape, x.dtype)
    cfg = _block_config(n_inter)
    kernel = functools.partial(
        _gated_and_mul_kernel,
        activation=activation,
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
            name=ACTIVATIONS[activation],
        )

    return run_on_platform(make_call, x_rows, interpret=interpret).reshape(out_shape)


_launch_jit = jax.jit(_launch, static_argnames=("activation", "interpret"))
_launch_interpreted = jax.jit(
    functools.partial(_launch, interpret=True),
    static_argnames=("activation",),
    compiler_options=INTERPRET_COMPILER_OPTIONS,
)
_backward_jit = jax.jit(launch_backward, static_argnames=("activation", "interpret"))
_backward_interpreted = jax.jit(
    functools.partial(launch_backward, interpret=True),
    static_argnames=("activation",),
    compiler_options=INTERPRET_COMPILER_OPTIONS,
)


def _run(x, activation, interpret):
    if interpret:
        return _launch_interpreted(x, activation=activation)
    return _launch_jit(x, activation=activation, interpret=interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gated_and_mul(x, activation, interpret):
    return _run(x, activation, interpret)


def _gated_and_mul_fwd(x, activation, interpret):
    return _run(x, activation, interpret), x


def _gated_and_mul_bwd(activation, interpret, x, cotangent):
    if interpret:
        return (_backward_interpreted(x, cotangent, activation=activation),)
    return (_backward_jit(x, cotangent, activation=activation, interpret=interpret),)


_gated_and_mul.defvjp(_gated_and_mul_fwd, _gated_and_mul_bwd)


def silu_and_mul(x: jax.Array, *, interpret: bool | None = None) -> jax.Array:
    """Fused `silu_and_mul_reference` (SwiGLU): x [..., 2I] (gate first) -> [..., I] in x's dtype.

    interpret: None (default) interprets on CPU and compiles on GPU, judged from x's device (or, inside
    jax.jit, from the platform being compiled for); True/False forces one or the other.
    Differentiable (jax.grad/vjp): the backward runs the fused backward kernel (swiglu_backward.py).
    """
    check_silu_and_mul_args(x)
    return _gated_and_mul(x, "silu", resolve_interpret(x, interpret))


def gelu_tanh_and_mul(x: jax.Array, *, interpret: bool | None = None) -> jax.Array:
    """Fused `gelu_tanh_and_mul_reference` (GeGLU, Gemma): x [..., 2I] (gate first) -> [..., I] in x's dtype.

    interpret: as silu_and_mul's. Differentiable (jax.grad/vjp): the backward runs the fused backward kernel.
    """
    check_silu_and_mul_args(x, op="gelu_tanh_and_mul")
    return _gated_and_mul(x, "gelu_tanh", resolve_interpret(x, interpret))
