"""The equivalent forms of one product x [..., in] @ W[in, out] (or W[out, in]^T, a tied head's), among which
jax_impl/linear.py chooses per shape by measurement: `FORMS[name](lhs, rhs, axis, precision, preferred_element_type)`,
axis 0 for W [in, out], 1 for W [out, in].

A product x [m, in] @ W with few rows m (a decode step) streams W, and how fast depends on how XLA:CPU
lowers it, which depends on the processor and the dtype. Four forms compute it:

- dot: the single dot. XLA:CPU lowers a one-row product to its own matrix-vector code, which reads a
  bfloat16 weight through a float32 copy of it; products of more rows go to its library matmul (a bfloat16 one
  only when asked for a float32 result, which `dot` does).
- split (float32): the contraction in SPLIT_CHUNKS contiguous row blocks of W (a reshape, no copy: [in, out]
  -> [c, in/c, out]), one batched product per block and a sum of the c partial rows: on some processors it
  streams tall, narrow [in, out] weights faster than the single dot (docs/benchmarks.md). Not offered in
  bfloat16, where XLA makes the same float32 copy of the weight for it as for the single dot.
- pad: a single bfloat16 row padded with a zero row, so that XLA hands the product to its library matmul
  (which reads bfloat16 weights as they are) instead of its matrix-vector code; the padding row's result is
  dropped. Not offered in float32, where the matrix-vector code reads the weight directly and two-row
  products streamed slower than one-row ones on both processor families measured (docs/benchmarks.md).
- gemv: the project's own CPU kernel (kernels/cpu/gemv.c through an XLA custom call, kernels/cpu/jax_gemv.py),
  one pass over the weight in its stored layout and dtype (bfloat16 widened as it is read), float32 compute,
  for up to jax_impl/linear.py's CHOICE_MAX_ROWS rows where it was built: XLA's matrix-vector code streams a
  chain of decode-sized weights below what the machine reads (docs/benchmarks.md).

A product of more rows (a prompt's, a training step's forward) is compute-bound, and has up to three forms, x @ W
only: the single dot, and

- gemm: the project's own GEMM (kernels/cpu/jax_gemm.py, an XLA custom call): float32 on AVX-512 (gemm.c),
  bfloat16 on AMX tiles (gemm_amx.c) or else on AVX512_BF16 (gemm_dpbf16.c), each built only where the processor
  has those instructions, for x @ W[in, out]. On such processors XLA:CPU's GEMM ran a prompt's products below what
  MKL, oneDNN on AMX, or vdpbf16ps reached (docs/benchmarks.md).
- upcast (bfloat16): bfloat16 storage, float32 compute, on gemm.c's float32 loops (each value widened as it is
  packed), on any AVX-512 processor: where the bf16 instructions run below the float32 FMAs (vdpbf16ps on an Intel
  Xeon without AMX exposed), or there are none (AVX-512 without AVX512_BF16), the faster form. torch_impl's
  "upcast" is the same loops on nn.Linear's layout (its "upcast_blocks" the same arithmetic on the libraries' GEMM).

Every form accumulates in float32 and rounds once to the output dtype; they differ only by summation order
(tests/jax_impl/test_linear.py checks each against a float64 product).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.cpu import jax_gemm, jax_gemv

SPLIT_CHUNKS = 8  # row blocks of W in the split form
LOW_PRECISION = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))  # accumulated in float32 (`dot`)


def _single(lhs: jax.Array, rhs: jax.Array, axis: int, precision, preferred_element_type) -> jax.Array:
    dims = (((lhs.ndim - 1,), (axis,)), ((), ()))
    return dot(lhs, rhs, dims, precision, preferred_element_type)


def dot(lhs: jax.Array, rhs: jax.Array, dims, precision, preferred_element_type, out_sharding=None) -> jax.Array:
    """jax.lax.dot_general; a bfloat16 / float16 product without an asked-for result type accumulates into a float32
    result, rounded once to the operands' dtype. The same arithmetic as a low-precision result (every form
    accumulates in float32), but XLA:CPU runs it differently: asked for a bf16 result it converts both operands to
    float32 copies and runs a float32 matmul; asked for a float32 one it hands the bf16 operands to its library
    matmul as they are, several times faster on a 128-row product (docs/benchmarks.md)."""
    low = preferred_element_type is None and jnp.dtype(lhs.dtype) in LOW_PRECISION and lhs.dtype == rhs.dtype
    out = jax.lax.dot_general(
        lhs,
        rhs,
        dims,
        precision=precision,
        preferred_element_type=jnp.float32 if low else preferred_element_type,
        out_sharding=out_sharding,
    )
    return out.astype(lhs.dtype) if low else out


def _split(lhs: jax.Array, rhs: jax.Array, axis: int, precision, preferred_element_type) -> jax.Array:
    k, n, c = rhs.shape[0], rhs.shape[1], SPLIT_CHUNKS  # axis 0 only
    x = lhs.reshape(-1, c, k // c)  # [m, c, in/c]
    w = rhs.reshape(c, k // c, n)  # [c, in/c, out]: row blocks of W, no copy
    partial = jnp.einsum("mck,ckn->cmn", x, w, precision=precision, preferred_element_type=jnp.float32)  # [c, m, out]
    out = partial.sum(axis=0)  # [m, out], float32
    return out.astype(preferred_element_type or lhs.dtype).reshape(*lhs.shape[:-1], n)  # [..., out]


def _pad(lhs: jax.Array, rhs: jax.Array, axis: int, precision, preferred_element_type) -> jax.Array:
    x = lhs.reshape(1, -1)  # [1, in]
    x2 = jnp.concatenate([x, jnp.zeros_like(x)])  # [2, in]: a matrix product, not XLA's matrix-vector one
    dims = (((1,), (axis,)), ((), ()))
    out = jax.lax.dot_general(x2, rhs, dims, precision=precision, preferred_element_type=jnp.float32)  # [2, out]
    return out[:1].astype(preferred_element_type or lhs.dtype).reshape(*lhs.shape[:-1], -1)  # [..., out]


def _gemv(lhs: jax.Array, rhs: jax.Array, axis: int, precision, preferred_element_type) -> jax.Array:
    x = lhs.reshape(-1, lhs.shape[-1])  # [m, in]
    out = jax_gemv.gemv(x, rhs, "cols" if axis == 0 else "rows")  # [m, out], float32: full precision
    return out.astype(preferred_element_type or lhs.dtype).reshape(*lhs.shape[:-1], -1)  # [..., out]


def _gemm(lhs: jax.Array, rhs: jax.Array, axis: int, precision, preferred_element_type) -> jax.Array:
    x = lhs.reshape(-1, lhs.shape[-1])  # [m, in]
    out = jax_gemm.gemm(x, rhs)  # [m, out], float32 (axis 0 only)
    return out.astype(preferred_element_type or lhs.dtype).reshape(*lhs.shape[:-1], -1)  # [..., out]


def _upcast(lhs: jax.Array, rhs: jax.Array, axis: int, precision, preferred_element_type) -> jax.Array:
    x = lhs.reshape(-1, lhs.shape[-1])  # [m, in]
    out = jax_gemm.upcast(x, rhs)  # [m, out], float32 (axis 0 only)
    return out.astype(preferred_element_type or lhs.dtype).reshape(*lhs.shape[:-1], -1)  # [..., out]


FORMS = {"dot": _single, "split": _split, "pad": _pad, "gemv": _gemv, "gemm": _gemm, "upcast": _upcast}
