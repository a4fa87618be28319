"""benchmarks/cpu_decode.py's own command line: a `--jax-compilation-cache` that is not a usable directory is refused
before any worker starts; and how it compares a variant with another. (The backends' processes, and the option's
effect: test_decode_backend.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.worker import ROOT


def test_a_cache_path_that_is_not_a_directory_is_refused_before_any_worker_starts(tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cpu_decode", "--jax-compilation-cache", str(taken)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"--jax-compilation-cache {taken}: not a usable directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_variant_is_compared_run_by_run():
    """Run i of the twelfth session's float32 runs, as measured: jax_impl and its per-op twin. The medians' ratio,
    10.97 / 11.71 = 0.94, set the call against the operators' two fast-minute runs; run by run it is 1.06."""
    from benchmarks.cpu_decode import paired_ratio

    call, operators = [12.72, 9.76, 10.80, 10.97, 11.05], [11.81, 11.84, 8.58, 10.33, 11.71]
    assert round(paired_ratio(call, operators), 3) == round(10.97 / 10.33, 3)  # the median of the five ratios
    assert paired_ratio([2.0, 3.0], [1.0, 1.0]) == 2.5  # an even count: the mean of the middle two
    with pytest.raises(ValueError):  # runs of different counts are not pairs
        paired_ratio([1.0, 2.0], [1.0])


def test_the_layer_rules_verdict_is_none_where_the_runs_disagree():
    """Run k (2026-12-06, float32): the call over the operators run by run x1.06, x0.94, x0.96, x1.10, x0.99, a
    median of x0.99; a near-tie that five runs cannot resolve either way, so no verdict."""
    from benchmarks.cpu_decode import rule_verdict

    call, operators = [12.56, 10.51, 11.54, 12.26, 10.15], [11.84, 11.17, 12.06, 11.18, 10.24]
    assert rule_verdict(call, operators) is None
    assert rule_verdict([2.0, 2.0], [1.0, 2.0]) is True  # as fast counts as held
    assert rule_verdict([1.0, 1.5], [1.1, 2.0]) is False
