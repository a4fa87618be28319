"""The KV cache's limits, shared by both backends' caches (torch_impl/kv_cache.py, jax_impl/kv_cache.py).

One rule and one message each: a cache may not hold more positions than the model has, and a write past a
cache's capacity is refused (docs/design.md, "The KV cache").
"""

from __future__ import annotations

from spec.config import ModelSpec
from spec.errors import InputError


def check_capacity(max_len: int, spec: ModelSpec) -> None:
    """Refuse a cache larger than the positions the model supports."""
    if max_len > spec.max_position_embeddings:
        raise InputError(
            f"KV cache of {max_len} positions exceeds max_position_embeddings={spec.max_position_embeddings}"
        )


def full_error(requested: int, capacity: int) -> InputError:
    """The error of a write that would end at slot `requested` in a cache of `capacity` slots."""
    return InputError(f"KV cache is full: {requested} positions requested, capacity {capacity}")
