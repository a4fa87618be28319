"""`Linear`: Flax's nnx.Linear (kernel [in, out], bias) whose product splits the contraction for decode steps.

Mirrors torch_impl/linear.py: each backend's CPU choice for the same projections. The parameters are
nnx.Linear's own, so the loader, sharding rules and checkpoints see no difference; only `dot_general`
changes, and only for float32 products of one token row (batch-1 decode) on the CPU:

x [m, in] @ W [in, out] streams W, and XLA:CPU's dot does that at 20-26 GB/s on the 2-core AMD EPYC this
project runs CI on for the tall, narrow weights of a decode step (o_proj [2048, 1024], down_proj
[3072, 1024]), against 29-34 GB/s for the same product on a [out, in] weight. Splitting the contraction into
SPLIT_CHUNKS contiguous row blocks of W (a reshape, no copy: [in, out] -> [c, in/c, out]), one batched
product per block and a sum of the c partial rows streams those weights at 26-29 GB/s. All 28 layers of
Qwen3-0.6B's products (benchmarks/gemv_layout.py, variants interleaved): 26.2 GB/s single dot, 30.3 GB/s
split, 31.8 GB/s on the [out, in] layout; a whole decode step gains 7-10%. With 2-4 rows XLA's dot runs at
14-16 GB/s whether split or not (measured), and prefill is compute-bound, so those keep the single dot.

The partial products accumulate in float32 and their sum is float32 too; the result differs from the single
dot only by summation order (max error vs a float64 product of the same order, tests/jax_impl/test_linear.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

SPLIT_MAX_ROWS = 1  # batch-1 decode: 2-4 rows measured no faster split
SPLIT_CHUNKS = 8  # 128-384 rows per block for Qwen3-0.6B's in-features; 4-16 measured within noise


def splits_contraction(lhs: jax.Array, rhs: jax.Array, dimension_numbers, out_sharding) -> bool:
    """True when `dot_general` computes this product as SPLIT_CHUNKS partial products (see the docstring)."""
    linear_form = dimension_numbers == (((lhs.ndim - 1,), (0,)), ((), ()))  # nnx.Linear's: x[..., in] @ W[in, out]
    return (
        linear_form
        and rhs.ndim == 2
        and out_sharding is None
        and lhs.dtype == rhs.dtype == jnp.float32
        and math.prod(lhs.shape[:-1]) <= SPLIT_MAX_ROWS  # token rows
        and rhs.shape[0] % SPLIT_CHUNKS == 0
        and jax.default_backend() == "cpu"
    )


def dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    out_sharding=None,
) -> jax.Array:
    """jax.lax.dot_general, except x[..., in] @ W[in, out] with one row of x runs as a split contraction."""
    if not splits_contraction(lhs, rhs, dimension_numbers, out_sharding):
        return jax.lax.dot_general(
            lhs,
            rhs,
            dimension_numbers,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
        )
    k, n, c = rhs.shape[0], rhs.shape[1], SPLIT_CHUNKS
    x = lhs.reshape(-1, c, k // c)  # [m, c, in/c]
    w = rhs.reshape(c, k // c, n)  # [c, in/c, out]: row blocks of W, no copy
    partial = jnp.einsum("mck,ckn->cmn", x, w, precision=precision, preferred_element_type=jnp.float32)  # [c, m, out]
    out = partial.sum(axis=0)  # [m, out]
    return out.astype(preferred_element_type or lhs.dtype).reshape(*lhs.shape[:-1], n)  # [..., out]


class Linear(nnx.Linear):
    """nnx.Linear with this file's `dot_general`; every other argument is nnx.Linear's."""

    def __init__(self, in_features: int, out_features: int, **kwargs):
        super().__init__(in_features, out_features, dot_general=dot_general, **kwargs)
