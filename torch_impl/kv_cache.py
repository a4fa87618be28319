"""A preallocated KV cache: [layers, B, max_len, n_kv, d] for keys and values, filled left to right.

Mirrors jax_impl/kv_cache.py (which is functional; this one is updated in place). Sized by the request
(batch, prompt + new tokens) and bounded by the model's max positions. `update` writes one layer's new
keys/values at slots [length, length + T) and returns every filled slot; the model calls `advance(T)`
once after all layers.
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
        shape = (spec.num_hidden_layers, batch, max_len, spec.num_key_value_heads, spec.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, S_max, n_kv, d]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, T, n_kv, d] -> every filled slot of this layer, [B, length + T, n_kv, d] each."""
        end = self.length + k.shape[1]
        if end > self.max_len:
            raise InputError(f"KV cache is full: {end} positions requested, capacity {self.max_len}")
        self.k[layer, :, self.length : end] = k
        self.v[layer, :, self.length : end] = v
        return self.k[layer, :, :end], self.v[layer, :, :end]

    def advance(self, steps: int) -> None:
        self.length += steps
