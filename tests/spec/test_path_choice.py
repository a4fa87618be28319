"""spec/path_choice.py: the measured choice among equivalent paths, on a fake clock (no timing is asserted:
each candidate advances the clock by a set amount, so every decision here is exact)."""

from __future__ import annotations

import threading

import pytest

from spec.choice_rules import COMPUTE_BOUND
from spec.path_choice import Pass, PathChoice
from tests.spec.path_choice_fakes import FakeClock, make


@pytest.mark.parametrize(
    ("plain_s", "other_s", "want"),
    [(1.0, 0.5, "other"), (0.5, 1.0, "plain"), (1.0, 0.96, "plain"), (1.0, 0.94, "other")],
)  # a 4% gain is within the 5% margin: the default stays
def test_fastest_beyond_the_margin(plain_s, other_s, want):
    clock, calls = FakeClock(), []
    choice = make(clock, repeats=2)
    runs = {"plain": clock.candidate(plain_s, calls, "plain"), "other": clock.candidate(other_s, calls, "other")}
    assert choice.choose("k", lambda: runs) == want
    # a warm-up and a round, each candidate in turn; a second round only where the other beat the default in the first
    passes = 3 if other_s < 0.95 * plain_s else 2
    assert calls == ["plain", "other"] * passes
    (measured,) = choice.chosen().values()
    assert measured.seconds == pytest.approx({"plain": plain_s, "other": other_s})
    assert measured.cost == pytest.approx(passes * (plain_s + other_s))
    assert choice.cost() == pytest.approx(measured.cost)


@pytest.mark.parametrize(
    ("plain_rounds", "other_rounds", "want"),
    [
        ([1.4, 1.0, 1.0], [0.9, 0.99, 0.98], "plain"),  # a slow spell in the default's first pass alone: it stays
        ([1.0, 1.0, 1.3], [0.9, 1.2, 0.9], "plain"),  # the other faster by min, but not in round 2
        ([1.0, 1.1, 1.0], [0.9, 0.9, 0.94], "other"),  # faster by more than the margin in every round
    ],
)
def test_another_path_must_win_every_round(plain_rounds, other_rounds, want):
    """The default is replaced only by a candidate that beats it by the margin in every round that timed both: the
    fastest single pass can be the default's slow spell, not the other path's speed."""
    clock, calls = FakeClock(), []
    choice = make(clock, repeats=3)
    runs = {
        "plain": clock.rounds([1.0, *plain_rounds], calls, "plain"),
        "other": clock.rounds([1.0, *other_rounds], calls, "other"),
    }
    assert choice.choose("k", lambda: runs) == want
    assert choice.chosen()["k"].seconds == pytest.approx({"plain": min(plain_rounds), "other": min(other_rounds)})


@pytest.mark.parametrize(
    ("plain_rounds", "other_rounds", "want"),
    [
        ([1.0, 1.0, 1.0, 1.0, 1.0], [0.9, 1.3, 0.9, 0.9, 0.95], "other"),  # a slow spell in one round does not decide
        ([1.0, 1.0, 1.0, 1.0, 1.0], [0.99, 0.98, 0.99, 0.97, 1.2], "plain"),  # 1% faster by the median: within 2%
        ([1.4, 1.0, 1.0, 1.0, 1.0], [0.9, 1.1, 1.05, 1.1, 0.9], "plain"),  # faster by its best pass only
    ],
)
def test_the_median_rule_takes_the_median_paired_ratio(plain_rounds, other_rounds, want):
    """rule="median": every candidate in every round, the order reversed every other round, and the one whose median
    ratio to the default's time in the same round is below 1 - margin."""
    clock, calls = FakeClock(), []
    choice = make(clock, repeats=5, margin=0.02, rule="median")
    runs = {
        "plain": clock.rounds([1.0, *plain_rounds], calls, "plain"),
        "other": clock.rounds([1.0, *other_rounds], calls, "other"),
    }
    assert choice.choose("k", lambda: runs) == want
    assert calls == ["plain", "other"] + ["plain", "other", "other", "plain"] * 2 + ["plain", "other"]
    measured = choice.chosen()["k"]
    assert measured.seconds == pytest.approx({"plain": min(plain_rounds), "other": min(other_rounds)})
    assert measured.cost == pytest.approx(1.0 + 1.0 + sum(plain_rounds) + sum(other_rounds))


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="rule 'mean'"):
        PathChoice("test", ("plain", "other"), rule="mean")
    clock = FakeClock()
    with pytest.raises(ValueError, match="rule 'mean'"):  # nor taken for one key
        make(clock).choose("k", lambda: {"plain": clock.candidate(1.0, [], "plain")}, rule="mean")


@pytest.mark.parametrize(("rule", "want"), [({}, "plain"), (COMPUTE_BOUND, "other")])
def test_a_key_decided_by_its_own_rule(rule, want):
    """One slow pass of a far faster candidate: under the PathChoice's rule ("every") it keeps the default; a key
    that asks for COMPUTE_BOUND (the median of three rounds, what the backends ask for a prompt's product) takes
    the faster one. The rule that decided is recorded with the choice."""
    assert dict(COMPUTE_BOUND) == {"rule": "median", "repeats": 3}
    clock, calls = FakeClock(), []
    choice = make(clock, repeats=3)
    runs = {
        "plain": clock.rounds([1.0, 1.0, 1.0, 1.0], calls, "plain"),
        "other": clock.rounds([1.0, 0.6, 1.3, 0.6], calls, "other"),  # the warm-up first
    }
    assert choice.choose("k", lambda: runs, **rule) == want
    assert len(calls) == 8 and choice.chosen()["k"].rule == rule.get("rule", "every")
    assert choice.rule == "every" and choice.repeats == 3  # the PathChoice's own, for the next key
    settled = choice.settle("s", "plain")
    assert (settled, choice.chosen()["s"].rule) == ("plain", "")  # settled untimed: no rule decided


def test_no_second_round_when_nothing_beat_the_default():
    """Only a candidate that beat the default by the margin in the first round can be taken: when none did, the
    first round decides, and a candidate that did not is not timed again while another still can win."""
    clock, calls = FakeClock(), []
    choice = PathChoice("test", ("plain", "close", "fast"), clock=clock, repeats=3)
    runs = {name: clock.candidate(s, calls, name) for name, s in (("plain", 1.0), ("close", 0.97), ("fast", 0.5))}
    assert choice.choose("k", lambda: runs) == "fast"
    assert calls == ["plain", "close", "fast"] * 2 + ["plain", "fast"] * 2  # "close" cannot win: one round
    calls.clear()
    runs.pop("fast")
    assert choice.choose("k2", lambda: runs) == "plain"
    assert calls == ["plain", "close"] * 2  # the warm-up and one round


def test_a_far_slower_candidate_is_timed_once():
    clock, calls = FakeClock(), []
    choice = make(clock, repeats=3)
    runs = {"plain": clock.candidate(3.0, calls, "plain"), "other": clock.candidate(1.0, calls, "other")}
    assert choice.choose("k", lambda: runs) == "other"
    assert calls == ["plain", "other"] * 2 + ["other"] * 2  # 3x slower in the first pass: not timed again
    assert choice.chosen()["k"].seconds == pytest.approx({"plain": 3.0, "other": 1.0})


def test_measured_once_per_key():
    clock, calls = FakeClock(), []
    choice = make(clock, repeats=1)
    built = []

    def candidates():
        built.append(1)
        return {"plain": clock.candidate(1.0, calls, "plain"), "other": clock.candidate(2.0, calls, "other")}

    assert [choice.choose("a", candidates) for _ in range(3)] == ["plain"] * 3
    assert len(built) == 1 and len(calls) == 4
    choice.choose("b", candidates)
    assert len(built) == 2 and set(choice.chosen()) == {"a", "b"}
    choice.clear()
    assert choice.chosen() == {} and choice.cost() == 0


def test_a_pass_evicts_before_each_timed_run_untimed():
    """A Pass's `evict` runs before every timed pass (not before the warm-up) and its time is in the choice's cost,
    never in a pass: an eviction ten times longer than the paths' passes leaves their seconds and the choice exact."""
    clock, calls = FakeClock(), []
    choice = make(clock, repeats=2)
    evict = clock.candidate(10.0, calls, "evict")
    runs = {"plain": clock.candidate(1.0, calls, "plain"), "other": clock.candidate(0.5, calls, "other")}
    assert choice.choose("k", lambda: {name: Pass(run, evict) for name, run in runs.items()}) == "other"
    assert calls == ["plain", "other"] + ["evict", "plain", "evict", "other"] * 2  # the warm-up, then two rounds
    (measured,) = choice.chosen().values()
    assert measured.seconds == pytest.approx({"plain": 1.0, "other": 0.5})
    assert measured.cost == pytest.approx(3 * 1.5 + 4 * 10.0)


def test_charged_seconds_count_in_the_cost_until_cleared():
    """A probe's time (`charge`) is part of what choosing cost, beside each key's measurement."""
    clock = FakeClock()
    choice = make(clock, repeats=1)
    choice.charge(0.25)
    choice.choose("k", lambda: {"plain": clock.candidate(1.0, [], "plain")})  # a warm-up and a pass: 2 s
    assert choice.cost() == pytest.approx(2.25)
    with pytest.raises(ValueError, match="charged seconds must be >= 0, got -1.0"):
        choice.charge(-1.0)
    with pytest.raises(ValueError, match="got nan"):
        choice.charge(float("nan"))
    assert choice.cost() == pytest.approx(2.25)  # a refused charge adds nothing
    choice.clear()
    assert choice.cost() == 0.0


def test_a_single_candidate_is_taken():
    clock = FakeClock()
    choice = make(clock)
    assert choice.choose("k", lambda: {"other": clock.candidate(1.0, [], "other")}) == "other"


def test_a_settled_key_is_recorded_untimed_and_kept():
    """A rule's path (`settle`): recorded with no timings and no cost, kept like a measured one; forced still wins."""
    clock = FakeClock()
    choice = make(clock)
    assert choice.settle("k", "other") == "other"
    assert choice.chosen() == {"k": choice.chosen()["k"]} and dict(choice.chosen()["k"].seconds) == {}
    assert choice.cost() == 0.0 and clock.now == 0.0
    assert choice.settle("k", "plain") == "other"  # the first record stands, as a measured choice does
    with choice.forced("plain"):
        assert choice.settle("j", "other") == "plain" and "j" not in choice.chosen()
    with pytest.raises(ValueError, match="unknown path"):
        choice.settle("x", "fast")


def test_forced_pins_without_measuring_and_only_in_its_block():
    clock = FakeClock()
    choice = make(clock)

    def never():
        raise AssertionError("measured while forced")

    with choice.forced("other"):
        assert choice.forced_path() == "other"
        assert choice.choose("k", never) == "other"
        seen = []
        thread = threading.Thread(target=lambda: seen.append(choice.forced_path()))
        thread.start()
        thread.join()
        assert seen == [None]  # another thread is not forced
    assert choice.forced_path() is None and choice.chosen() == {}


def test_timing_weights_offers_a_models_weights_by_key_in_its_block_only():
    """`resident(key)` lists the block's weights whose key matches, in the order given; nothing outside the block, in
    another thread, or for a key no weight has. The innermost block wins, and grouping waits for a measurement."""
    choice = make(FakeClock())
    keyed = []

    def key(weight: tuple[str, int]) -> str:
        keyed.append(weight)
        return weight[0]

    weights = [("q", 0), ("kv", 1), ("q", 2), ("kv", 3), ("kv", 4)]
    assert choice.resident("q") == []
    with choice.timing_weights(weights, key):
        assert keyed == []  # nothing grouped until asked
        assert choice.resident("kv") == [("kv", 1), ("kv", 3), ("kv", 4)]
        assert choice.resident("q") == [("q", 0), ("q", 2)] and choice.resident("head") == []
        assert len(keyed) == len(weights)  # grouped once
        seen = []
        thread = threading.Thread(target=lambda: seen.append(choice.resident("q")))
        thread.start()
        thread.join()
        assert seen == [[]]  # another thread is not offered them
        with choice.timing_weights([("q", 9)], key):
            assert choice.resident("q") == [("q", 9)] and choice.resident("kv") == []
        assert choice.resident("q") == [("q", 0), ("q", 2)]
    assert choice.resident("q") == []


def test_unknown_paths_are_refused():
    clock = FakeClock()
    choice = make(clock)
    with pytest.raises(ValueError, match="unknown path 'fast'"):
        with choice.forced("fast"):
            pass
    with pytest.raises(ValueError, match="not among"):
        choice.choose("k", lambda: {"fast": clock.candidate(1.0, [], "fast")})
    with pytest.raises(ValueError, match="not among"):
        choice.choose("k", lambda: {})
