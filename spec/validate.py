"""Checkpoint validation against the parameter table, from headers only, and the non-finite scan of a tensor.

`validate_checkpoint` lists the problems in one error (the first 20 and a count): missing tensors,
unexpected tensors, wrong shapes, an embedding whose row count is not the vocabulary size, and the
tied-head cases (in a tied checkpoint `lm_head.weight` absent is normal, present and equal to the
embedding is accepted and never loaded, present and different is refused). It reads names and shapes
only, and checks the layer count first, so a config that claims 10 million layers fails at once instead of
building a 100-million-row table; loaders call it before they allocate a model.

`check_finite` is the streaming NaN/Inf scan that `runtime_params` runs on each tensor as it is read.

This module works on anything with `names()`, `shape()`, `get()` and `directory` (spec/checkpoint.py's
`Checkpoint`), so it does not import that module, which imports this one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

import ml_dtypes
import numpy as np

from spec.config import ModelSpec
from spec.errors import CheckpointError, format_problems
from spec.params import param_table

# Buffers some older exports saved, recomputed from the spec: RoPE frequencies, and GPT-NeoX's (Pythia's)
# causal-mask buffers `attention.bias` / `attention.masked_bias` (its real biases end in `query_key_value.bias`
# and `dense.bias`).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "attention.bias", "attention.masked_bias")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")  # a mixture-of-experts layer's per-expert tensors (spec/params.py)
_LAYER = re.compile(r"(?:model|gpt_neox)\.layers\.(\d+)\.")  # the families' layer prefixes (spec/params.py)
_CHUNK = 1 << 16  # elements per scan step: the data and the bool result stay in the core's L2 cache
# The exponent bits of the 16-bit formats: all set means Inf or NaN.
_EXPONENT = {np.dtype(ml_dtypes.bfloat16): np.uint16(0x7F80), np.dtype(np.float16): np.uint16(0x7C00)}


class Tensors(Protocol):
    directory: Path

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def get(self, name: str) -> np.ndarray: ...


def validate_checkpoint(checkpoint: Tensors, spec: ModelSpec) -> None:
    """Raise a CheckpointError listing every way the checkpoint's tensors differ from the spec's table."""
    names = checkpoint.names()
    layers = {m.group(1) for name in names if (m := _LAYER.match(name))}
    if len(layers) < spec.num_hidden_layers:  # before the table: its size is what the config claims
        raise CheckpointError(
            f"checkpoint {checkpoint.directory} does not match its config: num_hidden_layers is "
            f"{spec.num_hidden_layers} but the checkpoint holds tensors of {len(layers)} layer(s)"
        )
    experts = {m.group(1) for name in names if (m := _EXPERT.search(name))}
    if spec.num_experts and len(experts) < spec.num_experts:  # likewise: E * layers rows are built next
        raise CheckpointError(
            f"checkpoint {checkpoint.directory} does not match its config: num_experts is {spec.num_experts} "
            f"but the checkpoint holds tensors of {len(experts)} expert(s)"
        )
    table = {e.name: e for e in param_table(spec)}
    present = set(names)
    problems: list[str] = []
    embed = "model.embed_tokens.weight"
    if embed in present and checkpoint.shape(embed)[0] != spec.vocab_size:
        problems.append(
            f"embedding {embed!r} has {checkpoint.shape(embed)[0]} rows but vocab_size is {spec.vocab_size}"
        )
    for name, entry in table.items():
        if name not in present:
            problems.append(f"missing tensor {name!r} (shape {list(entry.shape)})")
            continue
        shape = checkpoint.shape(name)
        if (shape != entry.shape and name != embed) or (name == embed and shape[1:] != entry.shape[1:]):
            problems.append(f"tensor {name!r} has shape {list(shape)}, expected {list(entry.shape)}")
    for name in sorted(present - set(table)):
        if name == "lm_head.weight" and spec.tie_word_embeddings:
            problems += _check_tied_head(checkpoint, present)
        elif not name.endswith(_IGNORED_SUFFIXES):
            problems.append(f"unexpected tensor {name!r} (shape {list(checkpoint.shape(name))})")
    if problems:
        raise CheckpointError(
            f"checkpoint {checkpoint.directory} does not match its config "
            f"({spec.model_type}, {spec.num_hidden_layers} layers):" + format_problems(problems)
        )


def _check_tied_head(checkpoint: Tensors, present: set[str]) -> list[str]:
    head, embed = "lm_head.weight", "model.embed_tokens.weight"
    if embed not in present:
        return []  # already reported as missing
    if checkpoint.shape(head) != checkpoint.shape(embed):
        return [
            f"tied checkpoint stores {head!r} of shape {list(checkpoint.shape(head))} != embedding "
            f"{list(checkpoint.shape(embed))}: the checkpoint is not really tied"
        ]
    if not np.array_equal(checkpoint.get(head), checkpoint.get(embed)):
        return [
            f"tie_word_embeddings is true but {head!r} differs from {embed!r}: the checkpoint is not really "
            "tied (set tie_word_embeddings to false to load a separate head)"
        ]
    return []


def check_finite(array: np.ndarray, name: str, where: Path | str) -> None:
    """Raise a CheckpointError naming tensor `name` if `array` holds a NaN or an infinity.

    Streams over the (memory-mapped) array in L2-sized chunks, so it reads each byte once and allocates
    nothing the size of the tensor; the details (count, first index) are computed only for a broken tensor.
    """
    if _all_finite(array):
        return
    bad = ~np.isfinite(array)
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    nan = int(np.isnan(array).sum())
    raise CheckpointError(
        f"{where}: tensor {name!r} holds {int(bad.sum())} non-finite value(s) ({nan} NaN, "
        f"{int(bad.sum()) - nan} infinite; the first at index {list(first)}): the checkpoint is broken "
        "(allow_nonfinite=True / --allow-nonfinite loads it anyway, e.g. to debug the export)"
    )


def _all_finite(array: np.ndarray) -> bool:
    if array.dtype in _EXPONENT:
        return _bits_all_finite(array, _EXPONENT[array.dtype])
    # NaN and +-Inf propagate through a sum, so a finite sum means finite elements: one read pass, no temporary
    # (numpy's pairwise sum streams a strided slice too). A non-finite sum may also be the overflow of large
    # finite values, so then the elements decide.
    with np.errstate(over="ignore", invalid="ignore"):  # inf - inf in the sum, or an overflow: expected here
        total = np.add.reduce(array, axis=None)
    return bool(np.isfinite(total)) or bool(np.isfinite(array).all())


def _bits_all_finite(array: np.ndarray, exponent: np.uint16) -> bool:
    """16-bit floats by their bits (exponent all ones = Inf or NaN), in row blocks of about _CHUNK elements:
    integer ops run at the float32 sum's speed, where bfloat16's ufunc loops and a float32-accumulated float16
    sum are 4-8x slower (measured), and the temporaries stay in cache."""
    bits = array.view(np.uint16)
    if bits.size == 0:
        return True
    rows = bits.reshape(len(bits), -1) if bits.ndim > 1 else bits.reshape(-1, 1)
    step = max(1, _CHUNK // max(1, rows.shape[1]))
    return not any(((rows[i : i + step] & exponent) == exponent).any() for i in range(0, rows.shape[0], step))
