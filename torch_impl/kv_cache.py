"""A preallocated KV cache: keys [layers, B, n_kv, max_len, d], values [layers, B, n_kv, d, max_len].

Mirrors jax_impl/kv_cache.py (which is functional; this one is updated in place), layouts included: each
kv head's keys are [S, d] rows and its values [d, S] rows, the operands of the two attention products, so a
decode step never transposes the cache. Sized by the request (batch, prompt + new tokens) and bounded by
the model's max positions. `update` writes one layer's new keys/values at slots [length, length + T) and
returns every filled slot (views, no copy); the model calls `advance(T)` once after all layers.
"""

from __future__ import annotations

import torch

from spec import InputError, ModelSpec


class KVCache:
    def __init__(self, spec: ModelSpec, batch: int, max_len: int, dtype: torch.dtype, device: torch.device | str):
        if max_len > spec.max_position_embeddings:
            raise InputError(
                f"KV cache of {max_len} positions exceeds max_position_embeddings={spec.max_position_embeddings}"
            )
        layers, n_kv, d = spec.num_hidden_layers, spec.num_key_value_heads, spec.head_dim
        self.k = torch.zeros(layers, batch, n_kv, max_len, d, dtype=dtype, device=device)  # [L, B, n_kv, S_max, d]
        self.v = torch.zeros(layers, batch, n_kv, d, max_len, dtype=dtype, device=device)  # [L, B, n_kv, d, S_max]
        self.max_len = max_len
        self.length = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k [B, n_kv, T, d], v [B, n_kv, d, T] -> this layer's filled slots: [B, n_kv, length + T, d] keys,
        [B, n_kv, d, length + T] values."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise InputError(f"KV cache is full: {end} positions requested, capacity {self.max_len}")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, ..., self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, ..., :end]

    def advance(self, steps: int) -> None:
        self.length += steps
