"""The token ids a check runs on: given ids, a tokenized prompt, or seeded random ids.

Every path ends in `spec.check_token_ids`, so an id outside the vocabulary or a sequence longer than the
model's positions is refused here, with a message naming it, before any model is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from spec import InputError, ModelSpec, check_token_ids

DEFAULT_SEQ_LEN = 16
DEFAULT_BATCH = 1


def parse_ids(text: str) -> np.ndarray:
    """ "1,2,3" -> [[1, 2, 3]]; rows separated by ';' ("1 2 3; 4 5 6"); commas or spaces between ids."""
    rows = [row for row in re.split(r"[;\n]", text) if row.strip()]
    if not rows:
        raise InputError("--ids is empty: give token ids like '1,2,3' (rows separated by ';')")
    parsed = []
    for k, row in enumerate(rows):
        tokens = [t for t in re.split(r"[,\s]+", row.strip()) if t]
        try:
            parsed.append([int(t) for t in tokens])
        except ValueError as err:
            raise InputError(f"--ids row {k} ({row.strip()!r}) is not a list of integers: {err}") from err
    lengths = sorted({len(r) for r in parsed})
    if len(lengths) > 1:
        raise InputError(f"--ids rows have different lengths {lengths}: every row needs the same length")
    return np.asarray(parsed, dtype=np.int64)


def tokenize(directory: str | Path, prompt: str) -> list[int]:
    """Token ids of `prompt` under the checkpoint's tokenizer.json (Hugging Face `tokenizers`)."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"--prompt needs a tokenizer, but {directory} has no tokenizer.json; pass --ids instead")
    try:
        from tokenizers import Tokenizer
    except ImportError as err:
        raise InputError(
            "--prompt needs the `tokenizers` package, which is not installed "
            "(pip install 'decoder-parity[hf]'); pass --ids instead"
        ) from err
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception for a malformed file
        raise InputError(f"{path} is not a valid tokenizer.json: {err}") from err
    ids = tokenizer.encode(prompt).ids
    if not ids:
        raise InputError(f"--prompt {prompt!r} tokenizes to no tokens")
    return ids


def resolve_ids(
    spec: ModelSpec,
    directory: str | Path,
    *,
    ids: np.ndarray | Sequence | str | None = None,
    prompt: str | None = None,
    seq_len: int | None = None,
    batch: int | None = None,
    seed: int = 0,
) -> np.ndarray:
    """The [B, T] int64 ids for a check, validated against the spec."""
    if ids is not None and prompt is not None:
        raise InputError("give either ids or a prompt, not both")
    if ids is not None:
        if seq_len is not None or batch is not None:
            raise InputError("--seq-len and --batch do not apply with --ids: the ids set the shape")
        array = parse_ids(ids) if isinstance(ids, str) else np.asarray(ids)
        if array.ndim == 1:
            array = array[None, :]
    elif prompt is not None:
        if seq_len is not None:
            raise InputError("--seq-len does not apply with --prompt: the prompt sets the length")
        tokens = tokenize(directory, prompt)
        array = np.asarray([tokens] * _positive("batch", batch, DEFAULT_BATCH), dtype=np.int64)
    else:
        seq = _positive("seq-len", seq_len, DEFAULT_SEQ_LEN)
        rows = _positive("batch", batch, DEFAULT_BATCH)
        if seq > spec.max_position_embeddings:
            raise InputError(
                f"--seq-len {seq} exceeds the model's max_position_embeddings ({spec.max_position_embeddings})"
            )
        array = np.random.default_rng(seed).integers(0, spec.vocab_size, size=(rows, seq), dtype=np.int64)
    return check_token_ids(array, spec, name="input ids")


def _positive(name: str, value: int | None, default: int) -> int:
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"--{name} must be a positive integer, got {value!r}")
    return int(value)
