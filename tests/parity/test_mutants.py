"""Mutation tests: every catalogued bug, injected into one backend, must fail the check at its component.

The catalogue is tests/parity/mutants.py (test-only; nothing there is reachable from the product). Runs in
float32 on the built-in default checkpoint (the eps mutant on one with rms_norm_eps = 0.1), batch 2, 8 tokens;
the model families' mutants (issue 15) on transformers-written FAMILY_CONFIGS checkpoints, batch 1, 19 tokens
(longer than every sliding window), in float32 unless the bug only exists in bfloat16.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import parity
from parity.capture import capture
from tests.parity.mutants import MUTANTS, SURVIVORS

CHECK = dict(seq_len=8, batch=2)
FAMILY_CHECK = dict(seq_len=19, batch=1)  # 19 > every window in FAMILY_CONFIGS (at most 7)


def run_check(checkpoints, hf_checkpoint, name: str, dtype: str):
    """parity.check on a built-in checkpoint (tests/parity/conftest.py) or a transformers-written family one."""
    if name in checkpoints:
        return parity.check(checkpoints[name], dtype=dtype, **CHECK)
    # no float32 drift runs: they have no verdict, and the mutants are judged on torch vs jax alone
    return parity.check(hf_checkpoint(name), dtype=dtype, baseline=False, **FAMILY_CHECK)


@pytest.mark.parametrize(("name", "dtype"), sorted({(m.checkpoint, m.dtype) for m in MUTANTS}))
def test_unmutated_checkpoints_pass(checkpoints, hf_checkpoint, name, dtype):
    """The harness is sound: without a mutant, every checkpoint the mutants use passes at their dtype."""
    report = run_check(checkpoints, hf_checkpoint, name, dtype)
    assert report.passed, report.verdict_line()


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_killed_and_localized(checkpoints, hf_checkpoint, mutant):
    with pytest.MonkeyPatch.context() as mp:
        mutant.inject(mp)
        if mutant.jax:
            jax.clear_caches()  # the jitted forward would otherwise reuse the unmutated program
        try:
            report = run_check(checkpoints, hf_checkpoint, mutant.checkpoint, mutant.dtype)
        finally:
            if mutant.jax:
                jax.clear_caches()
    assert not report.passed, f"{mutant.name} survived: {report.verdict_line()}"
    assert report.first_divergence == mutant.expect, (
        f"{mutant.name}: the report names {report.first_divergence}, expected {mutant.expect} ({mutant.why})"
    )
    assert mutant.expect in report.verdict_line()


def rounding_flips(directory, name: str, dtype: str) -> float:
    """The fraction of `name`'s elements whose torch and JAX values differ (in their last rounding, at bf16)."""
    ids = np.random.default_rng(0).integers(0, 200, (FAMILY_CHECK["batch"], FAMILY_CHECK["seq_len"]))
    torch_trace, jax_trace = (capture(b, directory, ids, dtype=dtype).trace[name] for b in ("torch", "jax"))
    return float(np.mean(torch_trace != jax_trace))


@pytest.mark.parametrize("mutant", SURVIVORS, ids=[m.name for m in SURVIVORS])
def test_survivor_is_below_the_tolerance_and_seen_by_rounding_agreement(checkpoints, hf_checkpoint, mutant):
    """A documented survivor (tests/parity/mutants.py says why): `check` passes it, while the fraction of elements
    rounded differently at its component, 0 between the correct backends there, is large. If `check` starts to
    kill it, move it to MUTANTS."""
    directory = hf_checkpoint(mutant.checkpoint)
    assert rounding_flips(directory, mutant.expect, mutant.dtype) <= 0.01  # correct backends round alike here
    with pytest.MonkeyPatch.context() as mp:
        mutant.inject(mp)
        report = run_check(checkpoints, hf_checkpoint, mutant.checkpoint, mutant.dtype)
        flips = rounding_flips(directory, mutant.expect, mutant.dtype)
    assert report.passed, f"{mutant.name} is now killed ({report.verdict_line()}): move it to MUTANTS"
    assert flips >= 0.1, f"{mutant.name}: only {flips:.1%} of {mutant.expect} rounded differently (measured 28%)"


def test_catalogue_covers_the_issue():
    """Every bug class the issues list has at least one mutant (or a documented survivor), and both backends
    receive mutants."""
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
        # issue 15
        "norm_offset_dropped",
        "embedding_scale_not_rounded",
        "gelu_erf_instead_of_tanh",
        "attn_softcap_dropped",
        "final_softcap_dropped",
        "sliding_window_off_by_one",
        "rope_scaling_on_local_layers",
        "olmo2_qk_norm_per_head",
        "parallel_residual_sequential",
        "partial_rotary_on_full_head",
        "norm_weight_multiply_in_bf16",  # a documented survivor: below every tolerance (mutants.py says why)
    }
    assert required <= names | {m.name for m in SURVIVORS}
    assert sum(m.jax for m in MUTANTS) >= 2 and sum(not m.jax for m in MUTANTS) >= 2
