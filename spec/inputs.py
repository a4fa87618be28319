"""Token-id validation at the model boundary, shared by both backends.

JAX's gather returns NaN (or clamps) for an out-of-range id and torch raises a device-side assert on a
GPU; neither names the id. Ids are small, so each backend hands a host copy here and gets back either
the ids or an `InputError` that names the offending value and where it sits.
"""

from __future__ import annotations

import numpy as np

from spec.config import ModelSpec
from spec.errors import InputError


def check_token_ids(ids: np.ndarray, spec: ModelSpec, *, past_length: int = 0, name: str = "input_ids") -> np.ndarray:
    """Check a [B, T] integer id array against the spec; `past_length` positions are already cached."""
    ids = np.asarray(ids)
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise InputError(f"{name} must have shape [batch, seq_len], got rank {ids.ndim} shape {list(ids.shape)}")
    batch, seq = ids.shape
    if batch == 0 or seq == 0:
        raise InputError(f"{name} is empty (shape {list(ids.shape)}): need at least one token per sequence")
    if past_length + seq > spec.max_position_embeddings:
        raise InputError(
            f"{name} reaches position {past_length + seq} (seq_len {seq}"
            + (f" after {past_length} cached" if past_length else "")
            + f") but the model supports max_position_embeddings={spec.max_position_embeddings}"
        )
    bad = (ids < 0) | (ids >= spec.vocab_size)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"{name}[{row}, {col}] = {int(ids[row, col])} is outside the vocabulary [0, "
            f"{spec.vocab_size}) ({int(bad.sum())} bad id(s) in all)"
        )
    return ids
