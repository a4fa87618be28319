"""A preallocated KV cache: keys [layers, B, n_kv, max_len, d], values [layers, B, n_kv, d, max_len].

Mirrors jax_impl/kv_cache.py (which is functional; this one is updated in place): the same `create`, the same
layouts and the same refusal of a write past capacity (docs/design.md, "The KV cache"). Each kv head's keys
are [S, d] rows and its values [d, S] rows, the operands of the two attention products, so a decode step
never transposes the cache. Sized by the request (batch, prompt + new tokens) and bounded by the model's
max positions. `update` writes one layer's new keys/values at slots [length, length + T) and returns every
filled slot (views, no copy); the model calls `advance(T)` once after all layers.
"""

from __future__ import annotations

import torch

from spec import ModelSpec
from spec.kv_cache import check_capacity, full_error


class KVCache:
    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k = k  # [L, B, n_kv, S_max, d]
        self.v = v  # [L, B, n_kv, d, S_max]
        self.max_len = k.shape[3]
        self.length = 0

    @classmethod
    def create(
        cls, spec: ModelSpec, batch: int, max_len: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> KVCache:
        """An empty cache for `spec`'s kv heads (a tensor-parallel rank's local ones: its module_spec)."""
        check_capacity(max_len, spec)
        layers, n_kv, d = spec.num_hidden_layers, spec.num_key_value_heads, spec.head_dim
        return cls(
            torch.zeros(layers, batch, n_kv, max_len, d, dtype=dtype, device=device),
            torch.zeros(layers, batch, n_kv, d, max_len, dtype=dtype, device=device),
        )

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k [B, n_kv, T, d], v [B, n_kv, d, T] -> this layer's filled slots: [B, n_kv, length + T, d] keys,
        [B, n_kv, d, length + T] values."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise full_error(end, self.max_len)
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, ..., self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, ..., :end]

    def advance(self, steps: int) -> None:
        self.length += steps
