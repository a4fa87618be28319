"""The two rules by which spec/path_choice.py's `PathChoice` decides a key from its candidates' timed rounds.

- "every": the default (the first candidate a key offers) stays unless another beats it by `margin` in every round
  that timed both. After the first round only the candidates that can still win are timed again, so a key whose
  default is plainly fastest costs one round. A slow spell during one of the default's passes cannot move a product
  off it alone; a slow spell during the other's passes keeps the default, however much faster the other is.
- "median": every candidate in every round (in turn, the order reversed every other round), and the one whose
  median ratio to the default's time in the same round is lowest, where it is below 1 - `margin`. Over three rounds
  no one slow spell decides, either way: the rule for a compute-bound product, whose passes on a shared VM can
  differ by more than the forms do (docs/benchmarks.md).

Each rule takes the candidates' passes and `time`, which times one pass (PathChoice's: its clock, and a `Pass`'s
eviction before it), and returns the path taken and each candidate's seconds per round. Framework-neutral.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from types import MappingProxyType

RULES = ("every", "median")
# How the backends decide a compute-bound product (a prompt's): its candidates' passes on a shared VM can differ by
# more than the forms do, and under rule "every" one slow pass of a far faster form kept the default
# (docs/benchmarks.md).
COMPUTE_BOUND = MappingProxyType({"rule": "median", "repeats": 3})

Rounds = dict[str, list[float]]  # each candidate's seconds, round by round


def every_round(
    runs: Mapping[str, object], default: str, repeats: int, time: Callable[[object], float], margin: float, prune: float
) -> tuple[str, Rounds]:
    """Rule "every"; a default `prune` times slower than the fastest in the first round is not timed again (it
    cannot win on noise: the first round decides)."""
    rounds = {name: [time(run)] for name, run in runs.items()}
    # Timed again: the candidates that beat the default by the margin in the first round (no other can be taken),
    # and the default while there are any, unless it was pruned.
    bar, first = (1 - margin) * rounds[default][0], min(times[0] for times in rounds.values())
    live = {name: run for name, run in runs.items() if rounds[name][0] < bar}
    if live and rounds[default][0] <= prune * first:
        live = {default: runs[default], **live}
    for _ in range(repeats - 1 if live else 0):
        for name, run in live.items():  # in turn: a slow spell hits every candidate of the round alike
            rounds[name].append(time(run))
    fastest = min(rounds, key=lambda name: min(rounds[name]))
    paired = zip(rounds[fastest], rounds[default], strict=False)  # the rounds that timed both (pruned: the first)
    return (fastest if all(f < (1 - margin) * d for f, d in paired) else default), rounds


def by_median(
    runs: Mapping[str, object], default: str, repeats: int, time: Callable[[object], float], margin: float
) -> tuple[str, Rounds]:
    """Rule "median"."""
    rounds: Rounds = {name: [] for name in runs}
    for r in range(repeats):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:  # neither always first after the other
            rounds[name].append(time(runs[name]))
    paired = {name: zip(times, rounds[default], strict=True) for name, times in rounds.items()}
    ratio = {name: statistics.median(t / d for t, d in pairs) for name, pairs in paired.items()}
    fastest = min(ratio, key=ratio.__getitem__)
    return (fastest if ratio[fastest] < 1 - margin else default), rounds
