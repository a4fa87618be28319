"""The KV cache's limits, shared by both backends' caches (torch_impl/kv_cache.py, jax_impl/kv_cache.py).

One rule and one message each: a cache may not hold more positions than the model has, and a write past a
cache's capacity is refused (docs/design.md, "The KV cache"); and one sizing rule: a sliding-window layer keeps
only the last `window` slots (`layer_slots`), a ring written at slot % size.
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


def layer_slots(spec: ModelSpec, layer: int, max_len: int) -> int:
    """The slots `layer` keeps in a cache for `max_len` positions: every one on a full layer; on a sliding layer
    a ring of min(window, max_len), because no query sees a key `window` or more slots before it."""
    window = spec.window(layer)
    return max_len if window is None else min(window, max_len)
