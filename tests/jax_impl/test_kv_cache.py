"""jax_impl/kv_cache.py: layouts, filled slots, and the refusal of a write past capacity (twin of
tests/torch_impl/test_kv_cache.py, same cases). Eagerly the refusal is immediate; under jit the cache records
the slot a write asked for and `check()` raises on the host, the same error."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec
from jax_impl import KVCache
from spec import InputError

SPEC = spec.DEFAULT_SPEC  # 2 layers, 2 kv heads, head_dim 24


def _kv(t: int, fill: float) -> tuple[jax.Array, jax.Array]:
    n_kv, d = SPEC.num_key_value_heads, SPEC.head_dim
    return jnp.full((1, n_kv, t, d), fill), jnp.full((1, n_kv, d, t), fill)  # k [B, n_kv, T, d], v [.., d, T]


def test_layouts_and_filled_slots():
    cache = KVCache.create(SPEC, 1, 5, jnp.float32)
    assert len(cache.k) == SPEC.num_hidden_layers
    assert cache.k[0].shape == (1, SPEC.num_key_value_heads, 5, SPEC.head_dim)
    assert cache.v[0].shape == (1, SPEC.num_key_value_heads, SPEC.head_dim, 5)
    cache, k, _ = cache.update(0, *_kv(3, 1.0))
    cache = cache.advance(3)
    cache, k, v = cache.update(0, *_kv(2, 2.0))  # fills the cache exactly
    np.testing.assert_array_equal(np.asarray(k[0, 0, :, 0]), [1.0, 1, 1, 2, 2])
    cache.check()  # nothing past capacity


def test_each_cache_is_fresh_zeros_even_after_another_was_donated():
    """create makes its buffers in one compiled program: each call must still give buffers of its own, all zero, in
    the asked dtype, so that a step donating (and overwriting) one cache leaves the next request's untouched."""

    def fill(cache: KVCache) -> KVCache:
        return cache.update(0, *_kv(4, 7.0))[0]

    first = KVCache.create(SPEC, 2, 4, jnp.bfloat16)
    jax.jit(fill, donate_argnums=0)(first)  # writes into, and consumes, first's buffers
    second = KVCache.create(SPEC, 2, 4, jnp.bfloat16)
    assert all(a.dtype == jnp.bfloat16 and a.shape[0] == 2 for a in second.k + second.v)
    assert all(not np.asarray(a.astype(jnp.float32)).any() for a in second.k + second.v)
    assert int(second.length) == 0 and int(second.requested) == 0
    assert {id(a) for a in second.k}.isdisjoint(id(a) for a in first.k)


def test_write_past_capacity_is_refused():
    cache = KVCache.create(SPEC, 1, 4, jnp.float32)
    cache, _, _ = cache.update(0, *_kv(3, 1.0))
    cache = cache.advance(3)
    with pytest.raises(InputError, match=r"KV cache is full: 5 positions requested, capacity 4"):
        cache.update(0, *_kv(2, 9.0))


def test_write_past_capacity_under_jit_is_refused_on_the_host():
    """dynamic_update_slice would clamp the write onto the last slots; the cache records it instead."""

    @jax.jit
    def write(cache: KVCache) -> KVCache:
        cache, _, _ = cache.update(0, *_kv(2, 9.0))
        return cache.advance(2)

    cache = write(write(KVCache.create(SPEC, 1, 4, jnp.float32)))  # 4 slots: full, and fine
    cache.check()
    with pytest.raises(InputError, match=r"KV cache is full: 6 positions requested, capacity 4"):
        write(cache).check()


def test_cache_larger_than_the_model_is_refused():
    with pytest.raises(InputError, match="exceeds max_position_embeddings"):
        KVCache.create(SPEC, 1, SPEC.max_position_embeddings + 1, jnp.float32)
