"""spec/choice_rules.py: the two rules, on scripted timings (a candidate's seconds, pass by pass)."""

from __future__ import annotations

import pytest

from spec.choice_rules import COMPUTE_BOUND, RULES, by_median, every_round


def scripted(seconds: dict[str, list[float]], order: list[str]):
    """(runs, time): each run is its name; `time` hands out the name's next scripted seconds and logs the order."""
    left = {name: list(times) for name, times in seconds.items()}

    def time(run: str) -> float:
        order.append(run)
        return left[run].pop(0)

    return {name: name for name in seconds}, time


@pytest.mark.parametrize(
    ("other", "want"),
    [([0.5, 0.5, 0.5], "other"), ([0.5, 0.97, 0.5], "default"), ([0.96, 0.5, 0.5], "default")],
)
def test_every_round_needs_a_win_by_the_margin_in_every_round(other, want):
    order = []
    runs, time = scripted({"default": [1.0, 1.0, 1.0], "other": other}, order)
    path, rounds = every_round(runs, "default", 3, time, margin=0.05, prune=2.0)
    assert path == want
    if other[0] >= 0.95:  # lost the first round: nothing is timed again
        assert order == ["default", "other"] and rounds == {"default": [1.0], "other": [0.96]}
    else:
        assert order == ["default", "other"] * 3 and rounds["other"] == other


def test_every_round_does_not_time_a_default_far_behind_again():
    order = []
    runs, time = scripted({"default": [3.0], "other": [1.0, 1.2, 1.1]}, order)
    path, rounds = every_round(runs, "default", 3, time, margin=0.05, prune=2.0)
    assert path == "other" and order == ["default", "other", "other", "other"]
    assert rounds == {"default": [3.0], "other": [1.0, 1.2, 1.1]}


def test_by_median_reverses_the_order_every_other_round_and_takes_the_median_ratio():
    order = []
    # ratios to the default's time in the same round: 0.6, 2.0, 0.7 -> median 0.7 (a mean would be 1.1)
    runs, time = scripted({"default": [1.0, 1.0, 1.0], "other": [0.6, 2.0, 0.7]}, order)
    path, rounds = by_median(runs, "default", 3, time, margin=0.05)
    assert path == "other" and rounds["other"] == [0.6, 2.0, 0.7]
    assert order == ["default", "other", "other", "default", "default", "other"]


def test_by_median_keeps_the_default_within_the_margin():
    runs, time = scripted({"default": [1.0, 1.0, 1.0], "other": [0.96, 0.5, 0.97]}, [])
    assert by_median(runs, "default", 3, time, margin=0.05)[0] == "default"  # median ratio 0.96 > 0.95


def test_the_compute_bound_rule_is_a_known_rule():
    assert RULES == ("every", "median") and COMPUTE_BOUND["rule"] in RULES and COMPUTE_BOUND["repeats"] == 3
    with pytest.raises(TypeError):
        COMPUTE_BOUND["repeats"] = 1  # read-only: the backends share it
