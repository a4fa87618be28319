"""A preallocated, functional KV cache: per layer [B, max_len, n_kv, d] keys and values, and a length.

Mirrors torch_impl/kv_cache.py (which updates in place). A pytree, so it passes through jit; its shapes
are fixed by the request (batch, prompt + new tokens), bounded by the model's max positions, so the
decode step compiles once. `update` writes one layer's new keys/values at slot `length` with
dynamic_update_slice (in place once the cache buffer is donated) and returns every slot: slots not yet
written are masked out by the caller's key mask.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from spec import InputError, ModelSpec


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    k: tuple[jax.Array, ...]  # per layer [B, S_max, n_kv, d]
    v: tuple[jax.Array, ...]
    length: jax.Array  # int32 scalar: slots filled so far

    @classmethod
    def create(cls, spec: ModelSpec, batch: int, max_len: int, dtype: jnp.dtype) -> KVCache:
        if max_len > spec.max_position_embeddings:
            raise InputError(
                f"KV cache of {max_len} positions exceeds max_position_embeddings={spec.max_position_embeddings}"
            )
        shape = (batch, max_len, spec.num_key_value_heads, spec.head_dim)
        layers = range(spec.num_hidden_layers)
        return cls(
            tuple(jnp.zeros(shape, dtype) for _ in layers),
            tuple(jnp.zeros(shape, dtype) for _ in layers),
            jnp.zeros((), jnp.int32),
        )

    def update(self, layer: int, k: jax.Array, v: jax.Array) -> tuple[KVCache, jax.Array, jax.Array]:
        """k, v [B, T, n_kv, d] -> (new cache, every slot of this layer's keys, values [B, S_max, n_kv, d])."""
        start = (0, self.length, 0, 0)
        k_all = jax.lax.dynamic_update_slice(self.k[layer], k.astype(self.k[layer].dtype), start)
        v_all = jax.lax.dynamic_update_slice(self.v[layer], v.astype(self.v[layer].dtype), start)
        new = dataclasses.replace(
            self,
            k=self.k[:layer] + (k_all,) + self.k[layer + 1 :],
            v=self.v[:layer] + (v_all,) + self.v[layer + 1 :],
        )
        return new, k_all, v_all

    def advance(self, steps: int) -> KVCache:
        return dataclasses.replace(self, length=self.length + steps)
