"""A preallocated KV cache: per layer keys [B, n_kv, S, d], values [B, n_kv, d, S]; S = max_len, or on a
sliding-window layer a ring of C = min(window, max_len) slots.

Mirrors jax_impl/kv_cache.py (which is functional; this one is updated in place): the same `create`, the same
layouts, the same ring and the same refusal of a write past capacity (docs/design.md, "The KV cache"). Each kv
head's keys are [S, d] rows and its values [d, S] rows, the operands of the two attention products, so a decode
step never transposes the cache. Sized by the request (batch, prompt + new tokens) and bounded by the model's
max positions; `max_len` is the request's positions on every layer, ring or not. The model calls `advance(T)`
once after all layers. One difference from the twin: a full layer's buffers start unwritten here (`create` says why),
where JAX's start as an XLA program's zeros; no reader of either sees a slot before it is written.

`update` writes one layer's T new keys/values at absolute slots [length, length + T). A full layer stores slot
s at index s and returns every filled slot (views, no copy). A sliding layer (issue 15: O(window) memory, not
O(max_len)) returns its C ring entries as they were before this step followed by the T new keys, [C + T] in all
(copied, since the write then overwrites ring entries), and stores the last min(T, C) new keys at index s % C.
The new keys come from the step itself, so a prompt longer than the window still sees each of its own keys.
Which absolute slot each returned key holds is `key_slots(T)` (-1 for a ring entry not yet written), from
which the model builds the sliding mask: it depends only on `length`, since every slot is written in order.
"""

from __future__ import annotations

import torch

from spec import ModelSpec
from spec.kv_cache import check_capacity, full_error, layer_slots


class KVCache:
    def __init__(self, k: tuple[torch.Tensor, ...], v: tuple[torch.Tensor, ...], max_len: int, ring: tuple[bool, ...]):
        self.k = k  # per layer [B, n_kv, S, d]: S = max_len, or C on a ring layer
        self.v = v  # per layer [B, n_kv, d, S]
        self.max_len = max_len  # positions the cache accepts (every layer, ring or not)
        self.ring = ring  # per layer: True where the layer keeps a ring of its window's slots
        self.length = 0

    @classmethod
    def create(
        cls, spec: ModelSpec, batch: int, max_len: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> KVCache:
        """An empty cache for `spec`'s kv heads (a tensor-parallel rank's local ones: its module_spec); sliding
        layers get a ring of spec/kv_cache.py's `layer_slots`, zeroed (a ring's empty entries are read, masked).
        A full layer's buffers are left unwritten: `update` hands out only its filled slots, and every reader of
        the buffers themselves (the CPU decode kernels) reads those alone, so zeroing them was a pass over the
        whole cache before each generation's prompt (docs/benchmarks.md has its cost)."""
        check_capacity(max_len, spec)
        n_kv, d = spec.num_key_value_heads, spec.head_dim
        layers = range(spec.num_hidden_layers)
        slots = [layer_slots(spec, i, max_len) for i in layers]
        ring = tuple(spec.window(i) is not None for i in layers)
        new = [torch.zeros if ring[i] else torch.empty for i in layers]
        return cls(
            tuple(new[i](batch, n_kv, s, d, dtype=dtype, device=device) for i, s in enumerate(slots)),
            tuple(new[i](batch, n_kv, d, s, dtype=dtype, device=device) for i, s in enumerate(slots)),
            max_len,
            ring,
        )

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k [B, n_kv, T, d], v [B, n_kv, d, T] -> this layer's keys [B, n_kv, S, d] and values [B, n_kv, d, S]:
        S = length + T filled slots on a full layer, C + T (ring, then the new ones) on a ring layer."""
        t = k.shape[2]
        end = self.length + t
        if end > self.max_len:
            raise full_error(end, self.max_len)
        cache_k, cache_v = self.k[layer], self.v[layer]
        if not self.ring[layer]:  # narrow, not slicing: a decode step makes ~100 of these views
            cache_k.narrow(2, self.length, t).copy_(k)
            cache_v.narrow(3, self.length, t).copy_(v)
            return cache_k.narrow(2, 0, end), cache_v.narrow(3, 0, end)
        c = cache_k.shape[2]
        k_all = torch.cat([cache_k, k.to(cache_k.dtype)], dim=2)  # [B, n_kv, C + T, d]: read before the write
        v_all = torch.cat([cache_v, v.to(cache_v.dtype)], dim=3)  # [B, n_kv, d, C + T]
        kept = min(t, c)  # earlier new keys would be overwritten within this very write
        index = torch.arange(end - kept, end, device=k.device) % c  # [kept], distinct since kept <= C
        cache_k[:, :, index] = k[:, :, t - kept :]
        cache_v[..., index] = v[..., t - kept :]
        return k_all, v_all

    def key_slots(self, steps: int) -> torch.Tensor:
        """The absolute slot of each key a ring layer's `update` returns for `steps` new keys: [C + steps] int,
        -1 where a ring entry is still empty. Ring index r holds the latest written slot s < length with
        s % C == r (every slot is written, in order), so this needs only `length`."""
        c = next(k.shape[2] for k, ring in zip(self.k, self.ring, strict=True) if ring)
        device = self.k[0].device
        last = self.length - 1 - torch.remainder(self.length - 1 - torch.arange(c, device=device), c)  # [C]
        new = self.length + torch.arange(steps, device=device)  # [steps]
        return torch.cat([last.clamp(min=-1), new])  # [C + steps]

    def advance(self, steps: int) -> None:
        self.length += steps
