"""The KV cache write through decode_ops_ffi.cc (kernels/cpu/jax_decode_ops.py's `write_cache`): bit for bit
dynamic_update_slice's result, odd shapes and both dtypes, a start clamped as it clamps, in place where the buffers are
donated with the other slots untouched; the rule that takes it (generation's prompt and decode steps, not
reference_only); errors that name the operands."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec
from jax_impl.kv_cache import KVCache
from kernels.cpu import build, jax_decode_ops

CAN_BUILD = build._unsupported() is None
pytestmark = pytest.mark.skipif(not CAN_BUILD, reason=f"the CPU kernels cannot be built here: {build._unsupported()}")


def randn(*shape: int, dtype: str, seed: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def buffers(b, n_kv, s, d, t, dtype):
    return (
        randn(b, n_kv, s, d, dtype=dtype, seed=0),  # cache_k: every slot already holding something
        randn(b, n_kv, d, s, dtype=dtype, seed=1),  # cache_v
        randn(b, n_kv, t, d, dtype=dtype, seed=2),  # k
        randn(b, n_kv, d, t, dtype=dtype, seed=3),  # v
    )


def bits(a: jax.Array) -> np.ndarray:
    return np.asarray(a).view(np.uint16 if a.dtype == jnp.bfloat16 else np.uint32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("b", "n_kv", "s", "d", "t", "start"), [
    (1, 8, 37, 24, 5, 0), (2, 3, 37, 24, 5, 11), (2, 3, 37, 24, 1, 36), (1, 2, 19, 40, 19, 0),
    (1, 2, 19, 40, 7, 15), (1, 2, 19, 40, 7, 1000),  # past the end: clamped to S - T, as dynamic_update_slice does
])  # fmt: skip
def test_the_write_is_dynamic_update_slices_bit_for_bit(dtype, b, n_kv, s, d, t, start):
    cache_k, cache_v, k, v = buffers(b, n_kv, s, d, t, dtype)
    got_k, got_v = jax.jit(jax_decode_ops.write_cache)(cache_k, cache_v, k, v, jnp.int32(start))
    want_k = jax.lax.dynamic_update_slice(cache_k, k, (0, 0, start, 0))
    want_v = jax.lax.dynamic_update_slice(cache_v, v, (0, 0, 0, start))
    np.testing.assert_array_equal(bits(got_k), bits(want_k))
    np.testing.assert_array_equal(bits(got_v), bits(want_v))


def test_donated_buffers_are_written_in_place():
    cache_k, cache_v, k, v = buffers(1, 2, 64, 16, 3, "bfloat16")
    before_k, before_v = np.asarray(cache_k).copy(), np.asarray(cache_v).copy()
    where = (cache_k.unsafe_buffer_pointer(), cache_v.unsafe_buffer_pointer())
    write = jax.jit(jax_decode_ops.write_cache, donate_argnums=(0, 1))
    got_k, got_v = write(cache_k, cache_v, k, v, jnp.int32(10))
    assert (got_k.unsafe_buffer_pointer(), got_v.unsafe_buffer_pointer()) == where
    keep = np.r_[0:10, 13:64]  # every slot but the three written
    np.testing.assert_array_equal(np.asarray(got_k)[:, :, keep], before_k[:, :, keep])
    np.testing.assert_array_equal(np.asarray(got_v)[..., keep], before_v[..., keep])


def _program(run) -> str:
    """The compiled text of one layer's cache update traced inside `run` (a context manager or None)."""
    cache = KVCache.create(spec.DEFAULT_SPEC, 1, 20, jnp.bfloat16)
    n_kv, d = spec.DEFAULT_SPEC.num_key_value_heads, spec.DEFAULT_SPEC.head_dim
    k, v = randn(1, n_kv, 4, d, dtype="bfloat16", seed=4), randn(1, n_kv, d, 4, dtype="bfloat16", seed=5)

    def update(cache, k, v):
        if run is None:
            return cache.update(0, k, v)[0]
        with run():
            return cache.update(0, k, v)[0]

    return jax.jit(update).lower(cache, k, v).compile().as_text()


def test_generation_takes_the_write_and_nothing_else_does():
    target = "decoder_parity_CacheWriteBF16"
    assert target in _program(jax_decode_ops.prompts) and target in _program(jax_decode_ops.decode_steps)
    assert target not in _program(None)  # a plain forward (training, a parity trace) keeps dynamic_update_slice

    def off_prompt():
        import contextlib

        stack = contextlib.ExitStack()
        stack.enter_context(jax_decode_ops.prompts())
        stack.enter_context(jax_decode_ops.reference_only())
        return stack

    assert target not in _program(off_prompt)


def test_bad_operands_name_the_problem():
    cache_k, cache_v, k, v = buffers(1, 2, 8, 16, 3, "float32")
    with pytest.raises(ValueError, match=r"write_cache: needs .* T <= S; got cache_k \(1, 2, 8, 16\)"):
        jax_decode_ops.write_cache(cache_k, cache_v, k.astype(jnp.bfloat16), v, 0)
    with pytest.raises(ValueError, match="write_cache: needs"):
        jax_decode_ops.write_cache(cache_k, cache_v, jnp.zeros((1, 2, 9, 16)), jnp.zeros((1, 2, 16, 9)), 0)
