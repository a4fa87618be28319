"""Backward mutation tests: every catalogued training bug, injected into one framework, must fail
`check --grad` at the gradient it touches first in backward order (or `--steps` on the parameter it
misupdates). The catalogue is tests/parity/grad_mutants.py. Float32, the built-in default checkpoint, 2 x 8.
"""

from __future__ import annotations

import jax
import pytest

import parity
from tests.parity.grad_mutants import GRAD_MUTANTS

CHECK = dict(dtype="float32", seq_len=8, batch=2, grad=True)


def test_unmutated_grad_check_passes(default_dir):
    report = parity.check(default_dir, **CHECK, steps=2)
    assert report.passed, report.verdict_line()
    assert report.first_divergence is None and all(s.passed for s in report.steps)


@pytest.mark.parametrize("mutant", GRAD_MUTANTS, ids=[m.name for m in GRAD_MUTANTS])
def test_grad_mutant_is_killed_and_localized(default_dir, mutant):
    with pytest.MonkeyPatch.context() as mp:
        mutant.inject(mp)
        if mutant.jax:
            jax.clear_caches()  # a jitted step would otherwise reuse the unmutated program
        try:
            report = parity.check(default_dir, **CHECK, steps=mutant.steps)
        finally:
            if mutant.jax:
                jax.clear_caches()
    assert not report.passed, f"{mutant.name} survived: {report.verdict_line()}"
    if mutant.steps:
        assert report.first_divergence is None, f"{mutant.name}: gradients should agree, {report.verdict_line()}"
        failed = [s for s in report.steps if not s.passed]
        assert failed and mutant.expect in failed[0].worst[0], (mutant.name, failed[0].worst if failed else None)
        assert failed[0].worst[0] in report.verdict_line()
    else:
        assert report.first_divergence == mutant.expect, (
            f"{mutant.name}: the report names {report.first_divergence}, expected {mutant.expect} ({mutant.why})"
        )
        assert mutant.expect in report.verdict_line()


def test_catalogue_covers_the_issue():
    names = {m.name for m in GRAD_MUTANTS}
    assert names >= {
        "tied_grad_from_head_only",
        "rmsnorm_backward_rms_constant",
        "silu_derivative_is_sigmoid",
        "residual_add_detached_in_layer_1",
        "loss_mean_over_all_positions",
        "weight_decay_on_norm_weights",
        "adam_bias_correction_missing",
    }


def test_bfloat16_steps_pass_and_a_missing_bias_correction_still_fails(default_dir):
    """bfloat16 steps against their own bound (parity/tolerances.py STEP_REASON: sign noise of Adam's first step
    and the parameters' bf16 rounding): the unmutated backends pass, and the bias-correction mutant (updates ~3x
    too large) still fails it."""
    bf16 = {**CHECK, "dtype": "bfloat16"}
    report = parity.check(default_dir, **bf16, steps=2)
    assert report.passed, report.format()
    (mutant,) = [m for m in GRAD_MUTANTS if m.name == "adam_bias_correction_missing"]
    with pytest.MonkeyPatch.context() as mp:
        mutant.inject(mp)
        jax.clear_caches()
        try:
            report = parity.check(default_dir, **bf16, steps=2)
        finally:
            jax.clear_caches()
    failed = [s for s in report.steps if not s.passed]
    assert failed and failed[0].worst[1] > failed[0].bound, [s.to_dict() for s in report.steps]
