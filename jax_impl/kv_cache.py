"""A preallocated, functional KV cache: per layer keys [B, n_kv, S, d], values [B, n_kv, d, S]; S = max_len, or on
a sliding-window layer a ring of C = min(window, max_len) slots.

Mirrors torch_impl/kv_cache.py (which updates in place): the same `create`, the same layouts, the same ring and
the same refusal of a write past capacity (docs/design.md, "The KV cache"). A pytree, so it passes through jit;
its shapes are fixed by the request (batch, prompt + new tokens), bounded by the model's max positions, so the
decode step compiles once. `max_len` (the request's positions, on every layer, ring or not) and `ring` (which
layers keep a ring) are static fields. `update` writes one layer's T new keys/values at absolute slots
[length, length + T):

- a full layer stores slot s at index s with dynamic_update_slice (in place once the cache buffer is donated;
  in generation on the CPU with kernels/cpu/jax_decode_ops.py's `write_cache`, the same result, because XLA:CPU
  computes a bfloat16 dynamic_update_slice in float32 over the whole buffer: a prompt's time then grew with the
  cache's capacity) and returns every slot, those not yet written as zeros (the caller's key mask excludes them too);
- a sliding layer (issue 15: O(window) memory, not O(max_len)) returns its C ring entries as they were before
  this step followed by the T new keys, [C + T] in all, and scatters the last min(T, C) new keys to index
  s % C. T and C are static, so every shape is; only `length` is traced. The new keys come from the step
  itself, so a prompt longer than the window still sees each of its own keys. `key_slots(T)` gives the absolute
  slot of each returned key (-1 = empty ring entry), from which the model builds the sliding mask.

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
import functools

import jax
import jax.numpy as jnp

from kernels.cpu import jax_decode_ops
from spec import ModelSpec
from spec.kv_cache import check_capacity, full_error, layer_slots

# Jitted steps take the cache as argument 1 and donate it, so XLA writes it in place. Positional only: jit
# takes explicit in_shardings (the sharded steps in tensor_parallel.py) only for positional arguments.
DONATE_CACHE = dict(donate_argnums=(1,))

STATIC = dict(metadata=dict(static=True))  # a pytree's metadata, part of its structure: not traced


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    k: tuple[jax.Array, ...]  # per layer [B, n_kv, S, d]: S = max_len, or C on a ring layer
    v: tuple[jax.Array, ...]  # per layer [B, n_kv, d, S]
    length: jax.Array  # int32 scalar: slots filled so far
    requested: jax.Array  # int32 scalar: the furthest slot any write asked for; > capacity means refused
    max_len: int = dataclasses.field(**STATIC)  # positions the cache accepts (every layer, ring or not)
    ring: tuple[bool, ...] = dataclasses.field(**STATIC)  # per layer: True where it keeps a ring of its window

    @classmethod
    def create(cls, spec: ModelSpec, batch: int, max_len: int, dtype: jnp.dtype) -> KVCache:
        """An empty cache for `spec`'s kv heads (a tensor-parallel model's: its module_spec); sliding layers get
        a ring of spec/kv_cache.py's `layer_slots`."""
        check_capacity(max_len, spec)
        n_kv, d = spec.num_key_value_heads, spec.head_dim
        layers = range(spec.num_hidden_layers)
        slots = [layer_slots(spec, i, max_len) for i in layers]
        k_shapes = tuple((batch, n_kv, s, d) for s in slots)  # [B, n_kv, S, d] per layer
        v_shapes = tuple((batch, n_kv, d, s) for s in slots)  # [B, n_kv, d, S] per layer
        k, v, length, requested = _zeros(k_shapes, v_shapes, jnp.dtype(dtype))()
        return cls(k, v, length, requested, max_len, tuple(spec.window(i) is not None for i in layers))

    def check(self) -> None:
        """Raise InputError if any write asked for slots past capacity (reads one scalar from the device)."""
        requested = int(self.requested)
        if requested > self.max_len:
            raise full_error(requested, self.max_len)

    def update(
        self, layer: int, k: jax.Array, v: jax.Array, *, zeroed: bool = True
    ) -> tuple[KVCache, jax.Array, jax.Array]:
        """k [B, n_kv, T, d], v [B, n_kv, d, T] -> (new cache, this layer's keys [B, n_kv, S, d] and values
        [B, n_kv, d, S]): on a full layer every slot (S = max_len, unwritten ones zero), on a ring layer the ring
        then the new ones (S = C + T). `zeroed=False` (a full layer only) returns the updated buffers themselves,
        the slots past length + T as they are, for a reader of the written slots alone (the CPU decode kernel)."""
        t = k.shape[2]
        end = self.length + t
        if not isinstance(end, jax.core.Tracer) and int(end) > self.max_len:
            raise full_error(int(end), self.max_len)
        cache_k, cache_v = self.k[layer], self.v[layer]
        k, v = k.astype(cache_k.dtype), v.astype(cache_v.dtype)
        if not self.ring[layer]:
            if jax_decode_ops.writes(cache_k, k):  # generation on the CPU: only the new slots written, in place
                k_all, v_all = jax_decode_ops.write_cache(cache_k, cache_v, k, v, self.length)
            else:
                k_all = jax.lax.dynamic_update_slice(cache_k, k, (0, 0, self.length, 0))
                v_all = jax.lax.dynamic_update_slice(cache_v, v, (0, 0, 0, self.length))
            k_out, v_out = k_all, v_all
            if zeroed:
                written = jnp.arange(k_all.shape[2]) < end  # [S_max]
                k_out, v_out = jnp.where(written[:, None], k_all, 0), jnp.where(written, v_all, 0)
        else:
            if not zeroed:
                raise ValueError(f"KVCache.update: layer {layer} keeps a ring; zeroed=False is for full layers")
            c = cache_k.shape[2]
            k_out = jnp.concatenate([cache_k, k], axis=2)  # [B, n_kv, C + T, d]: the ring before this write
            v_out = jnp.concatenate([cache_v, v], axis=3)  # [B, n_kv, d, C + T]
            kept = min(t, c)  # earlier new keys would be overwritten within this very write
            index = (end - kept + jnp.arange(kept)) % c  # [kept], distinct since kept <= C
            k_all = cache_k.at[:, :, index].set(k[:, :, t - kept :], unique_indices=True)
            v_all = cache_v.at[..., index].set(v[..., t - kept :], unique_indices=True)
        return self.written(layer, k_all, v_all, t), k_out, v_out

    def written(self, layer: int, k: jax.Array, v: jax.Array, steps: int) -> KVCache:
        """The cache with layer `layer`'s buffers replaced by k and v, into which `steps` new slots were written from
        `length` on (by `update`, or in place by the CPU decode kernel: kernels/cpu/jax_decode_layer.py): the slots
        asked for are recorded for `check`."""
        return dataclasses.replace(
            self,
            k=self.k[:layer] + (k,) + self.k[layer + 1 :],
            v=self.v[:layer] + (v,) + self.v[layer + 1 :],
            requested=jnp.maximum(self.requested, self.length + steps),
        )

    def key_slots(self, steps: int) -> jax.Array:
        """The absolute slot of each key a ring layer's `update` returns for `steps` new keys: [C + steps] int32,
        -1 where a ring entry is still empty. Ring index r holds the latest written slot s < length with
        s % C == r (every slot is written, in order), so this needs only `length`."""
        c = next(k.shape[2] for k, ring in zip(self.k, self.ring, strict=True) if ring)
        last = self.length - 1 - jnp.remainder(self.length - 1 - jnp.arange(c, dtype=jnp.int32), c)  # [C]
        new = self.length + jnp.arange(steps, dtype=jnp.int32)  # [steps]
        return jnp.concatenate([jnp.maximum(last, -1), new])  # [C + steps]

    def advance(self, steps: int) -> KVCache:
        return dataclasses.replace(self, length=self.length + steps)


@functools.cache
def _zeros(k_shapes: tuple, v_shapes: tuple, dtype: jnp.dtype):
    """One compiled program (per request shape) that makes every buffer of an empty cache, fresh at each call: a
    cache is 2 x layers buffers, and as that many eager jnp.zeros, each dispatched on its own, it cost every
    `generate` more host time than the buffers take to fill (docs/benchmarks.md has the figures)."""

    def zeros() -> tuple:
        k = tuple(jnp.zeros(shape, dtype) for shape in k_shapes)
        v = tuple(jnp.zeros(shape, dtype) for shape in v_shapes)
        return k, v, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)

    return jax.jit(zeros)
