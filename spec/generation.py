"""Framework-neutral parts of generation: request validation, ragged prompts, EOS ids from a checkpoint.

Both backends' `generate` start here, so a bad request gets the same error from either, and batching
prompts of different lengths (left padding plus an attention mask) is done once. A given mask must be
left-padded: generation appends each new token after the last slot, so a right-padded row would attend to
its padding's slots and decode from the wrong position (a silent wrong answer); it is refused, naming the row.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spec.config import ModelSpec
from spec.errors import ConfigError, DecoderParityError, InputError
from spec.inputs import check_attention_mask, check_left_padded, check_seed, check_token_ids
from spec.json_fields import is_int, is_number, load_json

MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)  # the smallest positive temperature both backends divide by


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k / top_p None mean off. `seed` fixes the random stream."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not is_number(self.temperature) or self.temperature < 0:
            raise InputError(f"temperature must be >= 0 (0 = greedy) and finite, got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:  # XLA flushes a subnormal to 0, and logits / 0 picks garbage
            raise InputError(
                f"temperature {self.temperature!r} is below float32's smallest normal number {MIN_TEMPERATURE:.8g}: "
                "use 0 for greedy decoding"
            )
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            raise InputError(f"top_k must be a positive integer or None, got {self.top_k!r}")
        if self.top_p is not None and (not is_number(self.top_p) or not 0 < self.top_p <= 1):
            raise InputError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        check_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Prompts:
    """A batch of prompts, left-padded: ids [B, T] and mask [B, T] (1 = real token), `lengths` per row."""

    ids: np.ndarray
    mask: np.ndarray
    lengths: tuple[int, ...]


def prepare_prompts(
    input_ids: np.ndarray | Sequence[Sequence[int]],
    spec: ModelSpec,
    max_new_tokens: int,
    attention_mask: np.ndarray | None = None,
    pad_id: int = 0,
) -> Prompts:
    """Validate a generation request; ragged lists of ids are left-padded with `pad_id` (masked out)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    ragged = isinstance(input_ids, (list, tuple)) and input_ids and all(_is_row(r) for r in input_ids)
    if ragged and attention_mask is None:
        lengths = [len(r) for r in input_ids]
        if min(lengths) == 0:
            raise InputError(f"prompt {lengths.index(0)} is empty: need at least one token per prompt")
        width = max(lengths)
        ids = np.full((len(input_ids), width), pad_id, np.int64)
        mask = np.zeros((len(input_ids), width), np.int64)
        for row, prompt in enumerate(input_ids):
            ids[row, width - len(prompt) :] = check_token_ids([prompt], spec, name=f"prompt {row}")[0]
            mask[row, width - len(prompt) :] = 1
    else:  # a padded [B, T] array (or equal-length lists) with its mask, or one without padding
        ids, mask = input_ids, attention_mask
    ids = check_token_ids(ids, spec)
    if mask is None:
        mask = np.ones(ids.shape, np.int64)
    else:
        mask = check_attention_mask(mask, *ids.shape)
        check_left_padded(mask)
    lengths = tuple(int(n) for n in mask.sum(-1))
    total = ids.shape[1] + max_new_tokens - 1  # positions the model runs: the last new token is never fed back
    if total > spec.max_position_embeddings:
        raise InputError(
            f"prompt length {ids.shape[1]} + max_new_tokens {max_new_tokens} - 1 = {total} positions exceed the "
            f"model's max_position_embeddings={spec.max_position_embeddings}"
        )
    return Prompts(ids, mask.astype(np.int64), lengths)


@dataclass(frozen=True)
class Request:
    """A `generate` call, validated: its sampling, its prompts left-padded, the ids that end a row."""

    params: SamplingParams
    prompts: Prompts
    eos: tuple[int, ...]


def check_request(
    spec: ModelSpec,
    input_ids: np.ndarray | Sequence[Sequence[int]],
    max_new_tokens: int,
    attention_mask: np.ndarray | None,
    eos_token_ids: int | Sequence[int] | None,
    default_eos: tuple[int, ...],
    *,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
) -> Request:
    """Both backends' `generate` start here, so that a request with several faults gets the same error from either:
    the sampling first, then the prompts, then the EOS ids (None: `default_eos`, the checkpoint's)."""
    params = SamplingParams(temperature, top_k, top_p, seed)
    prompts = prepare_prompts(input_ids, spec, max_new_tokens, attention_mask)
    eos = default_eos if eos_token_ids is None else check_eos_ids(eos_token_ids, spec)
    return Request(params, prompts, eos)


def _is_row(row: object) -> bool:
    """One prompt of a ragged batch: a list, tuple or range of ids, or a 1-D array (numpy, torch, JAX)."""
    return isinstance(row, (list, tuple, range)) or getattr(row, "ndim", None) == 1


def check_eos_ids(value: int | Sequence[int], spec: ModelSpec) -> tuple[int, ...]:
    """A `generate` call's eos_token_ids (one id, as transformers takes it, or a sequence; () = never stop) -> a tuple
    of ids in [0, vocab_size), or an InputError naming the value: an id the model cannot produce would never stop a
    row, silently."""
    values = [value] if is_int(value) or isinstance(value, np.integer) else value
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise InputError(f"eos_token_ids must be a token id or a sequence of them, got {value!r}")
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise InputError(f"eos_token_ids must hold integer token ids, got {v!r} in {value!r}")
        if not 0 <= v < spec.vocab_size:
            raise InputError(f"eos_token_ids: {int(v)} is outside the vocabulary [0, {spec.vocab_size})")
    return tuple(int(v) for v in values)


def eos_token_ids(directory: str | Path) -> tuple[int, ...]:
    """EOS ids from generation_config.json, else config.json (an int or a list); () when neither says.

    A generation_config.json that is unreadable or holds a malformed eos_token_id is ignored with a warning
    (it only sets a default; the model loads without it); a malformed eos_token_id in config.json, which
    the model was already read from, is a ConfigError.
    """
    generation = Path(directory) / "generation_config.json"
    if generation.is_file():
        try:
            value = _eos_value(generation)
        except DecoderParityError as err:
            warnings.warn(f"ignoring {generation}: {err}", stacklevel=2)
        else:
            if value is not None:
                return value
    config = Path(directory) / "config.json"
    value = _eos_value(config) if config.is_file() else None
    return () if value is None else value


def _eos_value(path: Path) -> tuple[int, ...] | None:
    data = load_json(path, ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(data).__name__}")
    value = data.get("eos_token_id")
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if not all(is_int(v) and v >= 0 for v in values):
        raise ConfigError(f"{path}: eos_token_id must be a token id >= 0 or a list of them, got {value!r}")
    return tuple(values)


@dataclass
class Generation:
    """What `generate` returns: new tokens per row (EOS included, nothing after it) and timings.

    `logits` (with return_logits=True) holds, per step, the float32 [B, V] logits each token was drawn from.
    """

    tokens: list[list[int]]
    prefill_seconds: float
    decode_seconds: float
    logits: list[np.ndarray] | None = None

    @property
    def decode_tokens_per_second(self) -> float:
        steps = max(len(t) for t in self.tokens) - 1  # the first token comes out of the prefill
        return steps * len(self.tokens) / self.decode_seconds if steps > 0 and self.decode_seconds > 0 else 0.0


def collect_tokens(steps: list[np.ndarray], eos: Sequence[int]) -> list[list[int]]:
    """[B] arrays per step -> per-row token lists, each cut after its first EOS."""
    table = np.stack(steps, axis=1) if steps else np.zeros((0, 0), np.int64)  # [B, steps]
    rows = []
    for row in table.tolist():
        for i, tok in enumerate(row):
            if tok in eos:
                row = row[: i + 1]
                break
        rows.append(row)
    return rows
