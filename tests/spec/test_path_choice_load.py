"""spec/path_choice.py: the share of the CPUs other processes used while choosing, told and warned about (on the fake
clock and fake CPU counters of path_choice_fakes.py)."""

from __future__ import annotations

import warnings

import pytest

from spec.path_choice import BUSY_MIN_SECONDS, BUSY_SHARE
from tests.spec.path_choice_fakes import FakeClock, FakeCpu, make


def test_other_processes_share_of_the_cpus_is_told_and_warned_once():
    """Others using 2 of 4 CPUs while choosing: a share of 0.5, over BUSY_SHARE, so a warning once the choosing
    has lasted BUSY_MIN_SECONDS, and only once; clear() forgets it."""
    clock = FakeClock()
    choice = make(clock, repeats=1, cpu=FakeCpu(clock, others=2.0))
    step = BUSY_MIN_SECONDS / 4  # a key's measurement: a warm-up and one pass of `step` / 2 each
    runs = {"plain": clock.candidate(step / 2, [], "plain")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choice.choose("a", lambda: runs)  # a quarter of the minimum: not judged yet
    assert choice.others_busy() == pytest.approx(0.5)
    with pytest.warns(RuntimeWarning, match=r"test: paths were chosen while other processes used 50% of the CPUs"):
        for key in "bcd":
            choice.choose(key, lambda: runs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choice.choose("e", lambda: runs)  # warned already
    choice.clear()
    assert choice.others_busy() is None


@pytest.mark.parametrize("others", [0.0, 0.9])
def test_a_quiet_machine_gives_no_warning(others):
    """Below BUSY_SHARE of the CPUs (0.9 of 4 is 22%), however long the choosing: no warning."""
    assert others / 4 < BUSY_SHARE
    clock = FakeClock()
    choice = make(clock, repeats=1, cpu=FakeCpu(clock, others=others))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for key in range(8):
            choice.choose(key, lambda: {"plain": clock.candidate(BUSY_MIN_SECONDS, [], "plain")})
    assert choice.others_busy() == pytest.approx(others / 4)


def test_without_cpu_counters_the_share_is_unknown():
    clock = FakeClock()
    choice = make(clock, repeats=1, cpu=lambda: None)  # not Linux
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choice.choose("k", lambda: {"plain": clock.candidate(10.0, [], "plain")})
    assert choice.others_busy() is None
