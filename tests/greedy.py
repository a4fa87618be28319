"""Greedy tokens compared across implementations that are each correct: identical, except after a near-tie.

Two correct float32 implementations that sum in different orders (another backend, another product shape on
another processor, a sharded model, a fused kernel) agree to about 1e-6 relative, so they pick the same argmax
unless the top two logits lie closer than that. There either choice is right, and after it the continuations
are different sequences. The rule, shared by every test that compares greedy runs: tokens are identical up to
the first step whose reference top-2 gap is below FP32_REL x max |logit|; that step, if any, is reported.
A disagreement anywhere else fails, naming the run, row and step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# The float32 tolerance of the decoder's logits (tests/parity/test_hf_reference.py, FP32_REL): two correct
# implementations differ by less, so a top-2 gap below it is a tie they may break differently.
FP32_REL = 1e-5


def top2_gap(logits: np.ndarray) -> tuple[float, float]:
    """(gap between the two largest logits, max |logit|) of one row [V]."""
    top2 = np.sort(np.asarray(logits, dtype=np.float64))[-2:]
    return float(top2[1] - top2[0]), float(np.abs(logits).max())


def assert_same_greedy(
    runs: dict[str, Sequence[Sequence[int]]], ref_logits: Sequence[np.ndarray], rel: float = FP32_REL
) -> list[str]:
    """Assert every run's tokens [B][n] equal the first run's, except from a near-tie step on.

    `ref_logits`: the first run's logits per step, each [B, V] (generate(..., return_logits=True)). Returns the
    near-tie steps found (to print: reported, not hidden)."""
    names = list(runs)
    reference = runs[names[0]]
    near_ties = []
    for name in names[1:]:
        assert len(runs[name]) == len(reference), f"{name}: {len(runs[name])} rows, {names[0]}: {len(reference)}"
        for row, (want, got) in enumerate(zip(reference, runs[name], strict=True)):
            for step, (a, b) in enumerate(zip(want, got, strict=False)):
                if a == b:
                    continue
                gap, scale = top2_gap(ref_logits[step][row])
                assert gap < rel * scale, (
                    f"{name} row {row} differs from {names[0]} at step {step}: {b} vs {a}, "
                    f"top-2 gap {gap:.3g} is not a near-tie (< {rel * scale:.3g})"
                )
                near_ties.append(f"{name} row {row} step {step}: gap {gap:.3g}")
                break  # after a legitimate near-tie split the continuations are different sequences
            else:
                assert len(got) == len(want), f"{name} row {row}: {len(got)} tokens, {names[0]}: {len(want)}"
    return near_ties
