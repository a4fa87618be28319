"""Checkpoint validation against the parameter table: every problem listed in one error.

Missing tensors, unexpected tensors, wrong shapes, an embedding whose row count is not the vocabulary
size, and the tied-head cases: in a tied checkpoint `lm_head.weight` absent is normal, present and
equal to the embedding is accepted (and never loaded), present and different means the checkpoint is
not really tied and is refused.
"""

from __future__ import annotations

import numpy as np

from spec.checkpoint import Checkpoint
from spec.config import ModelSpec
from spec.errors import CheckpointError
from spec.params import param_table

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older exports saved; recomputed from the spec


def validate_checkpoint(checkpoint: Checkpoint, spec: ModelSpec) -> None:
    table = {e.name: e for e in param_table(spec)}
    present = set(checkpoint.names())
    problems: list[str] = []
    embed = "model.embed_tokens.weight"
    if embed in present and checkpoint.shape(embed)[0] != spec.vocab_size:
        problems.append(
            f"embedding {embed!r} has {checkpoint.shape(embed)[0]} rows but vocab_size is {spec.vocab_size}"
        )
    for name, entry in table.items():
        if name not in present:
            problems.append(f"missing tensor {name!r} (shape {list(entry.shape)})")
        elif checkpoint.shape(name) != entry.shape and name != embed:
            problems.append(f"tensor {name!r} has shape {list(checkpoint.shape(name))}, expected {list(entry.shape)}")
        elif name == embed and checkpoint.shape(name)[1:] != entry.shape[1:]:
            problems.append(f"tensor {name!r} has shape {list(checkpoint.shape(name))}, expected {list(entry.shape)}")
    for name in sorted(present - set(table)):
        if name == "lm_head.weight" and spec.tie_word_embeddings:
            problems += _check_tied_head(checkpoint)
        elif not name.endswith(_IGNORED_SUFFIXES):
            problems.append(f"unexpected tensor {name!r} (shape {list(checkpoint.shape(name))})")
    if problems:
        raise CheckpointError(
            f"checkpoint {checkpoint.directory} does not match its config "
            f"({spec.model_type}, {spec.num_hidden_layers} layers):\n  " + "\n  ".join(problems)
        )


def _check_tied_head(checkpoint: Checkpoint) -> list[str]:
    head, embed = "lm_head.weight", "model.embed_tokens.weight"
    if embed not in checkpoint:
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
