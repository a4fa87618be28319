"""Mutation tests: every catalogued bug, injected into one backend, must fail the check at its component.

The catalogue is tests/parity/mutants.py (test-only; nothing there is reachable from the product). Runs in
float32 on the built-in default checkpoint (the eps mutant on one with rms_norm_eps = 0.1), batch 2, 8 tokens.
"""

from __future__ import annotations

import jax
import pytest

import parity
from tests.parity.mutants import MUTANTS

CHECK = dict(dtype="float32", seq_len=8, batch=2)


@pytest.mark.parametrize("name", sorted({m.checkpoint for m in MUTANTS}))
def test_unmutated_checkpoints_pass(checkpoints, name):
    """The harness is sound: without a mutant, every checkpoint the mutants use passes."""
    report = parity.check(checkpoints[name], **CHECK)
    assert report.passed, report.verdict_line()


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_killed_and_localized(checkpoints, mutant):
    with pytest.MonkeyPatch.context() as mp:
        mutant.inject(mp)
        if mutant.jax:
            jax.clear_caches()  # the jitted forward would otherwise reuse the unmutated program
        try:
            report = parity.check(checkpoints[mutant.checkpoint], **CHECK)
        finally:
            if mutant.jax:
                jax.clear_caches()
    assert not report.passed, f"{mutant.name} survived: {report.verdict_line()}"
    assert report.first_divergence == mutant.expect, (
        f"{mutant.name}: the report names {report.first_divergence}, expected {mutant.expect} ({mutant.why})"
    )
    assert mutant.expect in report.verdict_line()


def test_catalogue_covers_the_issue():
    """Every bug class the issue lists has at least one mutant, and both backends receive mutants."""
    names = {m.name for m in MUTANTS}
    required = {
        "rmsnorm_as_layernorm",
        "gate_up_order_swapped",
        "gelu_instead_of_silu",
        "multiply_dropped_silu_gate_only",
        "silu_dropped_gate_times_up",
        "tied_head_copied_and_quantized",
        "final_norm_misses_last_increment",
        "eps_outside_sqrt",
        "rope_interleaved",
        "gqa_repeat_not_interleave",
        "qk_norm_skipped",
        "causal_mask_off_by_one",
        "rope_theta_ignored",
    }
    assert required <= names
    assert sum(m.jax for m in MUTANTS) >= 2 and sum(not m.jax for m in MUTANTS) >= 2
