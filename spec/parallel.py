"""Tensor-parallel degree checks shared by both backends (jax_impl/sharding.py, torch_impl/tensor_parallel.py).

Framework-neutral, so a bad degree gets the same message from either backend and from the CLI before any
device or process is set up.
"""

from __future__ import annotations

from spec.config import ModelSpec
from spec.errors import ConfigError


def check_tp_degree(spec: ModelSpec, tp_size: int) -> None:
    """Raise a ConfigError naming every dimension that `tp_size` cannot split (the vocabulary is padded)."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ConfigError(f"tensor-parallel degree must be a positive integer, got {tp_size!r}")
    problems = []
    if spec.num_attention_heads % tp_size:
        problems.append(f"it does not divide num_attention_heads={spec.num_attention_heads}")
    n_kv = spec.num_key_value_heads
    if n_kv % tp_size and tp_size % n_kv:
        problems.append(
            f"it neither divides num_key_value_heads={n_kv} nor is a multiple of it "
            "(kv heads are split when it divides them, replicated when it is a multiple)"
        )
    if spec.intermediate_size % tp_size:
        problems.append(f"it does not divide intermediate_size={spec.intermediate_size}")
    if problems:
        raise ConfigError(f"tensor-parallel degree {tp_size} does not fit this model: " + "; ".join(problems))


def padded_vocab(spec: ModelSpec, tp_size: int) -> int:
    """The vocabulary rounded up to a multiple of the degree; padding rows are zero, their logits -inf."""
    return -(-spec.vocab_size // tp_size) * tp_size
