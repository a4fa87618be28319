"""Fused residual add + RMSNorm as a Pallas kernel (JAX). Twin of kernels/triton/rms_norm.py.

Contract and numerics: kernels/pallas/reference.py::add_rms_norm_reference (docs/design.md, "The numerics contract
of add_rms_norm"), including the family options: offset (Gemma's weight applied as 1 + w) and float32_weight
(Gemma's and OLMo 2's weight multiply in float32 before the one rounding). Three layers, like the Triton twin:

    _add_rms_norm_kernel   Pallas kernel: one program normalizes BLOCK_ROWS whole rows
    _block_config/_launch  block sizes (a pure function of the row width), the pallas_call
    add_rms_norm           the public entry point; jax.custom_vjp (backward: kernels/pallas/rms_norm_backward.py)

Functional, like all of JAX: the new residual is a new array, but the pallas_call aliases it to the residual
input (input_output_aliases), so under jax.jit XLA can write it into the residual's buffer when the old
residual is dead -- the in-place update nano-vllm does by hand in torch.

The refs are whole arrays (no BlockSpec): each program addresses its [BLOCK_ROWS, BLOCK_H] window with
pl.ds and masks the overhang, exactly as the Triton kernel does with pointers. Pallas' GPU (Triton)
lowering needs power-of-two block shapes, and a BlockSpec whose block overhangs the array would not be
masked there.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.pallas import INTERPRET_COMPILER_OPTIONS, MAX_BLOCK_H, resolve_interpret, run_on_platform
from kernels.pallas.reference import check_add_rms_norm_args, check_norm_options
from kernels.pallas.rms_norm_backward import launch_backward

__all__ = ["MAX_BLOCK_H", "add_rms_norm"]

# Same packing as the Triton twin (see there for why).
_ELEMENTS_PER_PROGRAM = 4096
_MAX_BLOCK_ROWS = 64


def _add_rms_norm_kernel(
    *refs, n_rows: int, n_cols: int, eps: float, offset: float, float32_weight: bool, block_rows: int, block_h: int
) -> None:
    if len(refs) == 5:
        x_ref, residual_ref, weight_ref, out_ref, new_residual_ref = refs
    else:
        (x_ref, weight_ref, out_ref), residual_ref = refs, None
    row0 = pl.program_id(0) * block_rows
    rows = row0 + jnp.arange(block_rows)
    cols = jnp.arange(block_h)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]  # [BLOCK_ROWS, BLOCK_H]
    block = (pl.ds(row0, block_rows), pl.ds(0, block_h))  # this program's window; may overhang the array

    # Padding lanes load 0, so they add nothing to the sum of squares.
    x = plgpu.load(x_ref.at[block], mask=mask, other=0.0).astype(jnp.float32)
    if residual_ref is not None:
        r = plgpu.load(residual_ref.at[block], mask=mask, other=0.0)
        # Round the sum to the activation dtype *before* normalizing: the unfused model normalizes the
        # stored (rounded) residual, and so must we to stay bit-compatible.
        s = (x + r.astype(jnp.float32)).astype(new_residual_ref.dtype)
        plgpu.store(new_residual_ref.at[block], s, mask=mask)
        x = s.astype(jnp.float32)

    variance = jnp.sum(x * x, axis=1, keepdims=True) / n_cols  # [BLOCK_ROWS, 1], true width, not BLOCK_H
    x_hat = x * lax.rsqrt(variance + eps)  # [BLOCK_ROWS, BLOCK_H] float32
    w = plgpu.load(weight_ref.at[pl.ds(0, block_h)], mask=col_ok, other=0.0)  # [BLOCK_H]
    w = w.astype(jnp.float32) + jnp.float32(offset)  # offset + w
    if float32_weight:
        # Gemma 2/3, OLMo 2: the weight multiply in float32, then the one rounding.
        out = x_hat * w[None, :]
    else:
        # Qwen/Llama: round the normalized value, then multiply by offset + w in the activation dtype. The
        # reference's `offset + weight` is itself a dtype op (rounded); w + 0.0 is exact. bf16*bf16 (and
        # fp16*fp16) is exact in fp32, so one cast afterwards rounds exactly like `w * normed` in D.
        w = w.astype(out_ref.dtype).astype(jnp.float32)
        out = x_hat.astype(out_ref.dtype).astype(jnp.float32) * w[None, :]
    plgpu.store(out_ref.at[block], out.astype(out_ref.dtype), mask=mask)


def _block_config(n_cols: int) -> dict[str, int]:
    """Block sizes for rows of width `n_cols`: BLOCK_H covers a whole row (GPU lowering needs a power of two)."""
    if n_cols < 1:
        raise ValueError(f"add_rms_norm: row width must be >= 1, got {n_cols}")
    block_h = pl.next_power_of_2(n_cols)
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
    x: jax.Array,
    residual: jax.Array | None,
    weight: jax.Array,
    *,
    eps: float,
    offset: float = 0.0,
    float32_weight: bool = False,
    interpret: bool | None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Run the kernel on checked arguments; returns out, or (out, new_residual), shaped like x."""
    n_cols = x.shape[-1]
    x_rows = x.reshape(-1, n_cols)  # [rows, H]
    n_rows = x_rows.shape[0]
    if n_rows == 0:
        return x if residual is None else (x, x)
    cfg = _block_config(n_cols)
    inputs = (x_rows, weight) if residual is None else (x_rows, residual.reshape(-1, n_cols), weight)
    row_shape = jax.ShapeDtypeStruct(x_rows.shape, x.dtype)  # [rows, H]
    kernel = functools.partial(
        _add_rms_norm_kernel,
        n_rows=n_rows,
        n_cols=n_cols,
        eps=eps,
        offset=offset,
        float32_weight=float32_weight,
        block_rows=cfg["BLOCK_ROWS"],
        block_h=cfg["BLOCK_H"],
    )

    def make_call(interpret_now: bool):
        return pl.pallas_call(
            kernel,
            out_shape=(row_shape,) if residual is None else (row_shape, row_shape),
            grid=(pl.cdiv(n_rows, cfg["BLOCK_ROWS"]),),
            # residual (input 1) and new residual (output 1) may share a buffer: each program reads its
            # rows of the residual before it writes them.
            input_output_aliases={} if residual is None else {1: 1},
            compiler_params=plgpu.CompilerParams(num_warps=cfg["num_warps"]),
            interpret=interpret_now,
            name="add_rms_norm",
        )

    outs = run_on_platform(make_call, *inputs, interpret=interpret)
    outs = tuple(o.reshape(x.shape) for o in outs)  # [..., H]
    return outs[0] if residual is None else outs


_STATIC = ("eps", "offset", "float32_weight")  # Python values the kernels are specialized on
_launch_jit = jax.jit(_launch, static_argnames=(*_STATIC, "interpret"))
_launch_interpreted = jax.jit(
    functools.partial(_launch, interpret=True), static_argnames=_STATIC, compiler_options=INTERPRET_COMPILER_OPTIONS
)
_backward_jit = jax.jit(launch_backward, static_argnames=(*_STATIC, "interpret"))
_backward_interpreted = jax.jit(
    functools.partial(launch_backward, interpret=True),
    static_argnames=_STATIC,
    compiler_options=INTERPRET_COMPILER_OPTIONS,
)


def _run(x, residual, weight, options, interpret):
    if interpret:
        return _launch_interpreted(x, residual, weight, **options)
    return _launch_jit(x, residual, weight, **options, interpret=interpret)


# options: (eps, offset, float32_weight), a hashable tuple of Python values (custom_vjp's non-diff argument).
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _add_rms_norm(x, residual, weight, options, interpret):
    return _run(x, residual, weight, dict(zip(_STATIC, options, strict=True)), interpret)


def _add_rms_norm_fwd(x, residual, weight, options, interpret):
    outs = _run(x, residual, weight, dict(zip(_STATIC, options, strict=True)), interpret)
    # Only s (the new residual, or x) and the weight are kept: the backward recomputes rstd and n from s.
    return outs, (x if residual is None else outs[1], weight)


def _add_rms_norm_bwd(options, interpret, saved, cotangents):
    s, weight = saved
    d_out, d_new_residual = cotangents if isinstance(cotangents, tuple) else (cotangents, None)
    kwargs = dict(zip(_STATIC, options, strict=True))
    if interpret:
        d_s, d_weight = _backward_interpreted(s, weight, d_out, d_new_residual, **kwargs)
    else:
        d_s, d_weight = _backward_jit(s, weight, d_out, d_new_residual, **kwargs, interpret=interpret)
    # s = x + residual: both get d_s; d(offset + w)/dw = 1, so the weight's gradient is that of offset + w.
    return d_s, None if d_new_residual is None else d_s, d_weight


_add_rms_norm.defvjp(_add_rms_norm_fwd, _add_rms_norm_bwd)


def add_rms_norm(
    x: jax.Array,
    residual: jax.Array | None,
    weight: jax.Array,
    eps: float,
    *,
    offset: float = 0.0,
    float32_weight: bool = False,
    interpret: bool | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Fused `add_rms_norm_reference`: returns out, or (out, new_residual) when `residual` is given.

    x: [..., H] float32/bfloat16/float16; residual: like x or None; weight: [H], x's dtype; eps > 0.
    offset: the weight is applied as offset + weight (Gemma: 1.0); float32_weight: the weight multiply in
    float32 before the one rounding (Gemma 2/3, OLMo 2) instead of in the dtype after it (Qwen, Llama).
    interpret: None (default) interprets on CPU and compiles on GPU, judged from x's device (or, inside
    jax.jit, from the platform being compiled for); True/False forces one or the other.
    Differentiable (jax.grad/vjp): the backward runs the fused backward kernels (rms_norm_backward.py).
    """
    check_add_rms_norm_args(x, residual, weight, eps)
    check_norm_options(offset, float32_weight)
    options = (float(eps), float(offset), bool(float32_weight))
    return _add_rms_norm(x, residual, weight, options, resolve_interpret(x, interpret))
