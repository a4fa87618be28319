"""A preallocated, functional KV cache: per layer keys [B, n_kv, max_len, d], values [B, n_kv, d, max_len].

Mirrors torch_impl/kv_cache.py (which updates in place): the same `create`, the same layouts and the same
refusal of a write past capacity (docs/design.md, "The KV cache"). A pytree, so it passes through jit; its
shapes are fixed by the request (batch, prompt + new tokens), bounded by the model's max positions, so the
decode step compiles once. `update` writes one layer's new keys/values at slot `length` with
dynamic_update_slice (in place once the cache buffer is donated) and returns every slot, those not yet
written as zeros (the caller's key mask excludes them too).

A write past capacity raises InputError at once when the cache is used eagerly. Under jit the length is
not known on the host and dynamic_update_slice would clamp the write onto the last slots, so the cache
records the furthest slot any write asked for (`requested`) and `check()` raises the same error on the
host; whatever runs a jitted step calls it before using the step's results (jax_impl/generate.py does).

The layouts are the attention products' operands (each kv head's keys as [S, d] rows, its values as
[d, S] rows), so no step transposes the cache; the zeroing `where` is the one pass that reads the updated
buffer, which keeps XLA from copying the donated cache to feed the products (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from spec import ModelSpec
from spec.kv_cache import check_capacity, full_error

# Jitted steps take the cache as argument 1 and donate it, so XLA writes it in place. Positional only: jit
# takes explicit in_shardings (the sharded steps in tensor_parallel.py) only for positional arguments.
DONATE_CACHE = dict(donate_argnums=(1,))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    k: tuple[jax.Array, ...]  # per layer [B, n_kv, S_max, d]
    v: tuple[jax.Array, ...]  # per layer [B, n_kv, d, S_max]
    length: jax.Array  # int32 scalar: slots filled so far
    requested: jax.Array  # int32 scalar: the furthest slot any write asked for; > capacity means refused

    @classmethod
    def create(cls, spec: ModelSpec, batch: int, max_len: int, dtype: jnp.dtype) -> KVCache:
        """An empty cache for `spec`'s kv heads (a tensor-parallel model's: its module_spec)."""
        check_capacity(max_len, spec)
        n_kv, d = spec.num_key_value_heads, spec.head_dim
        layers = range(spec.num_hidden_layers)
        return cls(
            tuple(jnp.zeros((batch, n_kv, max_len, d), dtype) for _ in layers),
            tuple(jnp.zeros((batch, n_kv, d, max_len), dtype) for _ in layers),
            jnp.zeros((), jnp.int32),
            jnp.zeros((), jnp.int32),
        )

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    def check(self) -> None:
        """Raise InputError if any write asked for slots past capacity (reads one scalar from the device)."""
        requested = int(self.requested)
        if requested > self.max_len:
            raise full_error(requested, self.max_len)

    def update(self, layer: int, k: jax.Array, v: jax.Array) -> tuple[KVCache, jax.Array, jax.Array]:
        """k [B, n_kv, T, d], v [B, n_kv, d, T] -> (new cache, this layer's keys [B, n_kv, S_max, d] and
        values [B, n_kv, d, S_max], every slot, unwritten ones zero)."""
        end = self.length + k.shape[2]
        if not isinstance(end, jax.core.Tracer) and int(end) > self.max_len:
            raise full_error(int(end), self.max_len)
        k_all = jax.lax.dynamic_update_slice(self.k[layer], k.astype(self.k[layer].dtype), (0, 0, self.length, 0))
        v_all = jax.lax.dynamic_update_slice(self.v[layer], v.astype(self.v[layer].dtype), (0, 0, 0, self.length))
        new = dataclasses.replace(
            self,
            k=self.k[:layer] + (k_all,) + self.k[layer + 1 :],
            v=self.v[:layer] + (v_all,) + self.v[layer + 1 :],
            requested=jnp.maximum(self.requested, end),
        )
        written = jnp.arange(k_all.shape[2]) < end  # [S_max]
        return new, jnp.where(written[:, None], k_all, 0), jnp.where(written, v_all, 0)

    def advance(self, steps: int) -> KVCache:
        return dataclasses.replace(self, length=self.length + steps)
