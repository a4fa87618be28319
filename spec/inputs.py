"""The one input boundary of both backends: token ids, positions, attention masks, dtype names, seeds.

JAX's gather returns NaN (or clamps) for an out-of-range id and torch raises a device-side assert on a
GPU; neither names the id. torch's embedding refuses integer dtypes other than int32/int64 while JAX takes
them; a position past the RoPE table is silently extrapolated by both. So each backend hands a host copy
of what it was given here and gets back arrays it can use as they are (int64 ids and positions, a bool
mask), or an `InputError` that names the offending value and where it sits. The same rules for both
backends, by construction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spec.config import ModelSpec
from spec.errors import InputError

DTYPE_NAMES = ("float32", "bfloat16", "float16")
MAX_SEED = 2**63 - 1  # torch's Generator and jax.random.key both take seeds in [0, 2**63)


def as_host_array(value: Any, name: str) -> np.ndarray:
    """A numpy view of a list, numpy array, torch tensor or JAX array; ragged lists are refused by name."""
    if hasattr(value, "detach"):  # a torch tensor: numpy() needs it on the host and out of autograd
        try:
            value = value.detach().cpu().numpy()
        except TypeError:  # a dtype numpy lacks (torch.bfloat16): never a valid id, position or mask
            raise InputError(f"{name} has dtype {value.dtype}, which is not an integer dtype") from None
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as err:  # a ragged nested list ("inhomogeneous shape")
        raise InputError(f"{name} must be a rectangular array (every row the same length): {err}") from None
    if array.dtype == object:
        raise InputError(f"{name} must be a rectangular array of integers, got ragged or mixed values")
    return array


def _integers(value: Any, name: str, what: str) -> np.ndarray:
    array = as_host_array(value, name)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise InputError(f"{name} must hold integer {what}, got dtype {array.dtype}")
    return array


def check_token_ids(ids: Any, spec: ModelSpec, *, past_length: int = 0, name: str = "input_ids") -> np.ndarray:
    """Check [B, T] ids (any integer dtype) against the spec, `past_length` positions already cached; -> int64."""
    ids = as_host_array(ids, name)
    if ids.size == 0:  # before the dtype: numpy makes [] and [[]] float64, and "not integer ids" would mislead
        raise InputError(f"{name} is empty (shape {list(ids.shape)}): need at least one token per sequence")
    ids = _integers(ids, name, "token ids")
    if ids.ndim != 2:
        raise InputError(f"{name} must have shape [batch, seq_len], got rank {ids.ndim} shape {list(ids.shape)}")
    batch, seq = ids.shape
    if past_length + seq > spec.max_position_embeddings:
        raise InputError(
            f"{name} reaches position {past_length + seq} (seq_len {seq}"
            + (f" after {past_length} cached" if past_length else "")
            + f") but the model supports max_position_embeddings={spec.max_position_embeddings}"
        )
    bad = (ids < 0) | (ids >= spec.vocab_size)  # compared in the ids' own dtype: uint64 cannot wrap
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"{name}[{row}, {col}] = {int(ids[row, col])} is outside the vocabulary [0, "
            f"{spec.vocab_size}) ({int(bad.sum())} bad id(s) in all)"
        )
    return ids.astype(np.int64, copy=False)


def check_positions(positions: Any, spec: ModelSpec, batch: int, seq: int) -> np.ndarray:
    """Check explicit RoPE positions [B, T] (any integer dtype): each in [0, max_position_embeddings); -> int64."""
    positions = _integers(positions, "positions", "positions")
    if positions.shape != (batch, seq):
        raise InputError(f"positions has shape {list(positions.shape)}, expected [{batch}, {seq}] like the ids")
    bad = (positions < 0) | (positions >= spec.max_position_embeddings)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"positions[{row}, {col}] = {int(positions[row, col])} is outside [0, "
            f"{spec.max_position_embeddings}) (max_position_embeddings)"
        )
    return positions.astype(np.int64, copy=False)


def check_attention_mask(mask: Any, batch: int, length: int) -> np.ndarray:
    """Check a [B, S] mask of 1 (real token) and 0 (padding), bool or integer; every row attends somewhere.

    A row of zeros has no token to attend to: its softmax would be over nothing, and its logits meaningless.
    """
    mask = as_host_array(mask, "attention_mask")
    if mask.shape != (batch, length):
        raise InputError(
            f"attention_mask has shape {list(mask.shape)}, expected [{batch}, {length}] (batch, cached + new tokens)"
        )
    if mask.dtype != np.bool_:
        if not np.issubdtype(mask.dtype, np.integer):
            raise InputError(f"attention_mask must hold 0/1 (integer or bool), got dtype {mask.dtype}")
        if ((mask != 0) & (mask != 1)).any():
            row, col = (int(i) for i in np.argwhere((mask != 0) & (mask != 1))[0])
            raise InputError(f"attention_mask[{row}, {col}] = {int(mask[row, col])}: a mask holds only 0 and 1")
    mask = mask.astype(bool, copy=False)
    empty = ~mask.any(axis=-1)
    if empty.any():
        raise InputError(
            f"attention_mask row {int(np.argmax(empty))} is all zeros: every row needs at least one real token "
            f"({int(empty.sum())} such row(s))"
        )
    return mask


def check_left_padded(mask: np.ndarray) -> None:
    """Generation appends each new token after the last slot, so padding must come before a row's tokens."""
    wrong = (np.diff(mask.astype(np.int8), axis=-1) < 0).any(axis=-1)  # a 1 followed by a 0
    if wrong.any():
        row = int(np.argmax(wrong))
        raise InputError(
            f"attention_mask row {row} is not left-padded ({_row(mask[row])}): generate needs the padding before "
            "each prompt's tokens (pad on the left, or pass the prompts as a list of lists and let generate pad)"
        )


def _row(row: np.ndarray) -> str:
    values = [int(v) for v in row[:16]]
    return str(values)[:-1] + (", ...]" if row.size > 16 else "]")


def check_routing(routing: Any, spec: ModelSpec, batch: int, length: int) -> dict[int, np.ndarray] | None:
    """Teacher-forced expert ids {sparse layer: [B, T, k] integers} (docs/design.md, "Mixture of experts") -> int64.

    Each id in [0, num_experts) and the k ids of a token distinct (a repeated expert would count twice in the
    weighted sum); JAX's gather would clamp an out-of-range id silently. None stays None."""
    if routing is None:
        return None
    if not isinstance(routing, dict):
        raise InputError(f"routing must be a dict layer index -> expert ids [B, T, k], got {type(routing).__name__}")
    k, e, checked = spec.num_experts_per_tok, spec.num_experts, {}
    for layer, ids in routing.items():
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not spec.is_sparse(int(layer)):
            raise InputError(f"routing given for layer {layer!r}, which is not a sparse layer {spec.sparse_layers}")
        layer = int(layer)
        array = _integers(ids, f"routing for layer {layer}: expert ids", "expert ids")
        if array.shape != (batch, length, k):
            raise InputError(
                f"routing for layer {layer}: expert ids of shape {list(array.shape)}, expected "
                f"[{batch}, {length}, {k}] (batch, tokens, num_experts_per_tok)"
            )
        bad = np.argwhere((array < 0) | (array >= e))  # compared in the ids' own dtype: uint64 cannot wrap
        if len(bad):
            where = [int(i) for i in bad[0]]
            raise InputError(
                f"routing for layer {layer}: expert id {int(array[tuple(where)])} at {where} is outside "
                f"[0, {e}) (num_experts = {e})"
            )
        ordered = np.sort(array, axis=-1)
        repeated = np.argwhere(ordered[..., 1:] == ordered[..., :-1])
        if len(repeated):
            row, col, j = (int(i) for i in repeated[0])
            raise InputError(
                f"routing for layer {layer}: expert {int(ordered[row, col, j])} appears twice for token [{row}, {col}]"
            )
        checked[layer] = array.astype(np.int64, copy=False)
    return checked


def dtype_name(dtype: Any) -> str:
    """One of DTYPE_NAMES, from its name or a framework's dtype of that name (torch.bfloat16, jnp.float16,
    np.float32), or an InputError naming the supported ones: float64, None or anything else is refused by both
    loaders alike, never loaded as it comes (torch took 1 for a device index)."""
    name = dtype if isinstance(dtype, str) else _framework_dtype_name(dtype)
    if name not in DTYPE_NAMES:
        raise InputError(f"dtype {dtype!r} is not supported (choose: {', '.join(DTYPE_NAMES)})")
    return name


def _framework_dtype_name(dtype: Any) -> str | None:
    text = str(dtype)
    if text.startswith("torch."):  # torch.float32: no numpy dtype of its own
        return text.removeprefix("torch.")
    if dtype is None:
        return None  # numpy reads None as float64
    try:
        return np.dtype(dtype).name  # numpy's and JAX's (ml_dtypes' bfloat16 included)
    except TypeError:
        return None


def check_seed(seed: Any, name: str = "seed") -> int:
    """A random seed both frameworks accept: an integer in [0, 2**63)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise InputError(f"{name} must be an integer in [0, 2**63), got {seed!r}")
    return int(seed)
