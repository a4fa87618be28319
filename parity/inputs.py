"""The token ids a check runs on: given ids, a tokenized prompt, or seeded random ids.

Every path ends in `spec.check_token_ids`, so an id outside the vocabulary or a sequence longer than the
model's positions is refused here, with a message naming it, before any model is loaded. So is a run too
large for the machine (`check_run_size`): `--batch 1000000000` is refused before the ids are drawn.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from spec import InputError, ModelSpec, check_token_ids
from spec.inputs import check_seed

DEFAULT_SEQ_LEN = 16
DEFAULT_BATCH = 1
_INT64_MAX = 2**63 - 1


def int_option(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (argparse reports a bad value as a usage error, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be >= {low}, got {value}" if value < low else f"must be <= {high}, got {value}"
            )
        return value

    return parse


def parse_ids(text: str) -> np.ndarray:
    """ "1,2,3" -> [[1, 2, 3]]; rows separated by ';' ("1 2 3; 4 5 6"); commas or spaces between ids."""
    rows = [row for row in re.split(r"[;\n]", text) if row.strip()]
    if not rows:
        raise InputError("--ids is empty: give token ids like '1,2,3' (rows separated by ';')")
    parsed = []
    for k, row in enumerate(rows):
        tokens = [t for t in re.split(r"[,\s]+", row.strip()) if t]
        try:
            values = [int(t) for t in tokens]
        except ValueError as err:
            raise InputError(f"--ids row {k} ({row.strip()!r}) is not a list of integers: {err}") from err
        too_large = [v for v in values if abs(v) > _INT64_MAX]
        if too_large:  # would overflow int64 before the vocabulary check could name it
            raise InputError(f"--ids row {k}: {too_large[0]} is outside the vocabulary (and any integer dtype)")
        parsed.append(values)
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
    seed = check_seed(seed)
    if ids is not None:
        if seq_len is not None or batch is not None:
            raise InputError("--seq-len and --batch do not apply with --ids: the ids set the shape")
        array = parse_ids(ids) if isinstance(ids, str) else ids
        array = check_token_ids(array if np.ndim(array) != 1 else [array], spec, name="input ids")
    elif prompt is not None:
        if seq_len is not None:
            raise InputError("--seq-len does not apply with --prompt: the prompt sets the length")
        tokens = tokenize(directory, prompt)
        rows = _positive("batch", batch, DEFAULT_BATCH)
        check_run_size(spec, rows, len(tokens))
        array = np.asarray([tokens] * rows, dtype=np.int64)
    else:
        seq = _positive("seq-len", seq_len, DEFAULT_SEQ_LEN)
        rows = _positive("batch", batch, DEFAULT_BATCH)
        if seq > spec.max_position_embeddings:
            raise InputError(
                f"--seq-len {seq} exceeds the model's max_position_embeddings ({spec.max_position_embeddings})"
            )
        check_run_size(spec, rows, seq)
        array = np.random.default_rng(seed).integers(0, spec.vocab_size, size=(rows, seq), dtype=np.int64)
    array = check_token_ids(array, spec, name="input ids")
    check_run_size(spec, *array.shape)
    return array


def run_bytes(spec: ModelSpec, batch: int, seq: int) -> int:
    """A lower bound on the host memory a check of [batch, seq] ids needs beyond the weights (float32).

    The torch and jax traces are both held for the comparison, each with every component of every token
    (parity/components.py: per layer the norms, q, k, attention, the MLP's gate_up and activation, x1, x2;
    the logits), and a forward holds one layer's attention scores [heads, seq, seq] per row.
    """
    s = spec
    per_layer = (
        6 * s.hidden_size + 3 * s.intermediate_size + (s.num_attention_heads + s.num_key_value_heads) * s.head_dim
    )
    per_token = s.vocab_size + 2 * s.hidden_size + s.num_hidden_layers * per_layer
    return 4 * batch * (2 * seq * per_token + s.num_attention_heads * seq * seq)


def check_run_size(spec: ModelSpec, batch: int, seq: int) -> None:
    """Refuse, before anything is allocated, a batch whose trace could not fit in this machine's memory."""
    need = run_bytes(spec, batch, seq)
    have = _physical_memory()
    if have is not None and need > have:
        raise InputError(
            f"batch {batch} x seq_len {seq} needs about {need / 2**30:.1f} GiB for the traced forwards "
            f"(logits and every component of every layer, per token), more than this machine's "
            f"{have / 2**30:.1f} GiB of memory: use a smaller --batch or --seq-len"
        )


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: no bound here
        return None


def _positive(name: str, value: int | None, default: int) -> int:
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"--{name} must be a positive integer, got {value!r}")
    return int(value)
