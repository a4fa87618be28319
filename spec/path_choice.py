"""Which of several equivalent compute paths a product takes, chosen by timing them on the machine that runs them.

A CPU product can run through more than one library or formulation: torch through MKL (behind F.linear) or
oneDNN's matmul, XLA through its single dot or the contraction split into row blocks, either through the project's
own CPU kernel. Each computes the same product up to the order of a float32 sum, and which is faster depends on the
processor and its libraries (docs/benchmarks.md records an AMD EPYC and an Intel Xeon ranking them in opposite
orders). So no backend fixes a preference: at the first product of a given key (shape and dtype) it asks its
`PathChoice`, which times the candidates on operands of that shape in rounds, each candidate once per round, taken
in turn so that a drift in the machine's speed hits every candidate of a round alike (after the first round only
those that can still be taken), keeps the fastest for the rest of the process and records what measuring cost.

The first candidate in `paths` order is the key's default, and one of two rules (spec/choice_rules.py) decides
whether another replaces it: "every" (it must beat the default by `margin` in every round that timed both: a slow
spell during one of the default's passes, which on a shared VM can cost it a good part of one pass, cannot move a
product off it alone) or "median" (the median of the rounds' paired ratios: no one slow spell decides, either way;
for compute-bound products, whose passes swing more). A PathChoice has a rule, and a key can ask for another
(`choose`). The choice of a process does not change once made.

Correctness never depends on the choice: every candidate computes the same product (the backends' tests check
each path against a float64 product), and `forced(path)` pins one for the calling thread, for tests and for
side-by-side comparisons. Framework-neutral: the backends supply the timed callables.

A pass that streams weights is timed from memory: a decode step streams more weights than the last-level cache
holds and finds each one there, while a pass of a few tens of MB stays in a cache larger than it (480 MiB reported on
the Intel VMs here), where the paths rank otherwise (docs/benchmarks.md). A candidate given as a `Pass` has its
`evict` step run, untimed, before each timed pass: the backend's way of taking the pass's operands out of the caches.

The timed operands are the backend's to supply. A backend timing over fresh memory pays for mapping it, which on a
VM whose other processes hold their memory cost more than the timing itself (docs/benchmarks.md); inside
`timing_weights(...)` a measurement can take a model's own weights of the key's shape instead (`resident`), resident
already, and the very memory its products stream.

A choice is only as good as the moment it was timed in: while another process holds the cores, the paths that run
on a team of threads can rank last and be left out for the rest of the process. So the share of the CPUs other
processes used while choosing is measured (spec/cpu_load.py, Linux) and told: `others_busy()`, and a RuntimeWarning
once it reaches BUSY_SHARE over at least BUSY_MIN_SECONDS of choosing. `clear()` makes every key measure again.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from spec.choice_rules import RULES, by_median, every_round
from spec.cpu_load import CpuSample, OthersBusy, cpu_sample

BUSY_SHARE = 0.25  # other processes' share of the CPUs while choosing, from which the choice is called into doubt
BUSY_MIN_SECONDS = 0.5  # of choosing, before that share is judged: the machine's counters tick every ~10 ms


class _Resident:
    """A `timing_weights` block's weights, grouped by key on first use."""

    def __init__(self, weights: Iterable[object], key: Callable[[object], Hashable]):
        self.weights, self.key, self.groups = list(weights), key, None

    def get(self, key: Hashable) -> list:
        if self.groups is None:
            self.groups = {}
            for weight in self.weights:
                self.groups.setdefault(self.key(weight), []).append(weight)
        return self.groups.get(key, [])


@dataclass(frozen=True)
class Choice:
    """The path taken for one key, each candidate's best pass in seconds (none where a rule settled it), the
    measurement's wall time, and the rule that decided ("every" or "median"; "" where a rule settled it untimed)."""

    path: str
    seconds: Mapping[str, float]
    cost: float
    rule: str = ""


@dataclass(frozen=True)
class Pass:
    """A timing pass whose operands are taken out of the caches before it is timed: `evict` runs untimed before each
    timed `run` (not before the warm-up, whose first touch it would only repeat)."""

    run: Callable[[], object]
    evict: Callable[[], object]

    def __call__(self) -> object:
        return self.run()


Timed = Callable[[], object] | Pass  # a candidate's pass: a plain run, timed as it finds the caches, or a Pass


class PathChoice:
    """The measured choice among `paths` (the first one a key offers is its default) of a backend's products, per
    key."""

    def __init__(
        self,
        name: str,
        paths: tuple[str, ...],
        *,
        repeats: int = 2,
        margin: float = 0.05,
        prune: float = 2.0,
        clock: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], CpuSample | None] | None = cpu_sample,
        rule: str = "every",
    ):
        """`repeats` rounds of one timed pass per candidate after a warm-up, but one round for those that did not
        beat the default by `margin` in the first (all of them, when none did) and for a default `prune` times
        slower than the fastest; `clock` is the timer (tests pass a fake one); `cpu` samples the machine's CPU
        counters around each measurement (None: not measured); `rule` "every" (the above) or "median" (the module
        docstring)."""
        self.name, self.paths, self.repeats, self.margin, self.clock = name, paths, repeats, margin, clock
        self.rule = self._rule(rule)
        self.prune = prune
        self._chosen: dict[Hashable, Choice] = {}
        self.version = 0  # counts `clear`s: a caller that keeps what it learnt from the choices keys it on this
        self._charged = 0.0  # choosing work that belongs to no one key (`charge`)
        self._forced: contextvars.ContextVar[str | None] = contextvars.ContextVar(f"{name}.forced", default=None)
        self._resident: contextvars.ContextVar[_Resident | None] = contextvars.ContextVar(
            f"{name}.resident", default=None
        )
        self._lock = threading.RLock()
        self.cpu = cpu
        self._load = OthersBusy()  # other processes' use of the CPUs while this choice measured
        self._warned = False

    def _rule(self, rule: str) -> str:
        if rule not in RULES:
            raise ValueError(f"{self.name}: rule {rule!r} is 'every' or 'median'")
        return rule

    def check(self, path: str) -> str:
        if path not in self.paths:
            raise ValueError(f"{self.name}: unknown path {path!r} (paths: {', '.join(self.paths)})")
        return path

    @contextlib.contextmanager
    def forced(self, path: str) -> Iterator[None]:
        """Within the block, every product that has a choice takes `path`, measured or not (this thread)."""
        token = self._forced.set(self.check(path))
        try:
            yield
        finally:
            self._forced.reset(token)

    def forced_path(self) -> str | None:
        return self._forced.get()

    @contextlib.contextmanager
    def timing_weights(self, weights: Iterable[object], key: Callable[[object], Hashable]) -> Iterator[None]:
        """Within the block (this thread), `resident(k)` lists the `weights` whose `key(weight)` is k (their shape
        and dtype, as the backend spells them): a model's parameters, grouped only if a measurement asks."""
        token = self._resident.set(_Resident(weights, key))
        try:
            yield
        finally:
            self._resident.reset(token)

    def resident(self, key: Hashable) -> list:
        """The weights under `key` that the innermost `timing_weights` block offers (none outside one)."""
        pool = self._resident.get()
        return [] if pool is None else pool.get(key)

    def choose(
        self,
        key: Hashable,
        candidates: Callable[[], Mapping[str, Timed]],
        *,
        rule: str | None = None,
        repeats: int | None = None,
    ) -> str:
        """The path for `key`: the forced one, the one chosen before, or the fastest of `candidates()` now.

        `candidates()` builds, only when a measurement is due, one zero-argument callable per path that runs
        a pass of the product (and waits for its result), or a `Pass` that also evicts the pass's operands; a path it
        leaves out is unavailable here. `rule` and `repeats`, where given, decide this key instead of the
        PathChoice's own (the module docstring).
        """
        forced = self._forced.get()
        if forced is not None:
            return forced
        rule = self._rule(self.rule if rule is None else rule)
        repeats = self.repeats if repeats is None else repeats
        choice = self._chosen.get(key)
        if choice is None:
            with self._lock:
                choice = self._chosen.get(key)
                if choice is None:
                    choice = self._chosen[key] = self._measure(candidates, rule, repeats)
        return choice.path

    def settle(self, key: Hashable, path: str) -> str:
        """The path for `key` where a rule leaves one candidate: recorded like a measured choice, at no cost, so a
        report of the choices lists it (its `seconds` are empty). A forced path still wins."""
        forced = self._forced.get()
        if forced is not None:
            return forced
        with self._lock:
            choice = self._chosen.setdefault(key, Choice(self.check(path), {}, 0.0))
        return choice.path

    def _measure(self, candidates: Callable[[], Mapping[str, Timed]], rule: str, repeats: int) -> Choice:
        start, before = self.clock(), self._sample()
        runs = dict(candidates())
        unknown = set(runs) - set(self.paths)
        if unknown or not runs:
            raise ValueError(f"{self.name}: candidates {sorted(runs)} are not among {self.paths}")
        for run in runs.values():
            run()  # warm-up: set-up, compilation, first touch
        default = next(p for p in self.paths if p in runs)
        if rule == "median":
            path, rounds = by_median(runs, default, repeats, self._time, self.margin)
        else:
            path, rounds = every_round(runs, default, repeats, self._time, self.margin, self.prune)
        cost = self.clock() - start
        self._note_load(before, self._sample(), cost)
        return Choice(path, {name: min(times) for name, times in rounds.items()}, cost, rule)

    def _sample(self) -> CpuSample | None:
        return None if self.cpu is None else self.cpu()

    def _note_load(self, before: CpuSample | None, after: CpuSample | None, seconds: float) -> None:
        """Add a measurement's stretch to the CPU use while choosing; warn once when other processes held too much
        of the machine for the choices to be trusted on a quiet one."""
        self._load.add(before, after, seconds)
        share = self._load.share()
        if self._warned or share is None or share < BUSY_SHARE or self._load.seconds < BUSY_MIN_SECONDS:
            return
        self._warned = True
        warnings.warn(
            f"{self.name}: paths were chosen while other processes used {share:.0%} of the CPUs; a path that runs "
            f"on several threads may have timed slower than it runs on a quiet machine, and the choice is kept for "
            f"the process (PATHS.clear() in {self.name} measures again)",
            RuntimeWarning,
            stacklevel=2,
        )

    def others_busy(self) -> float | None:
        """The share of the CPUs other processes used while this choice measured (None: nothing measured, or not
        Linux)."""
        return self._load.share()

    def _time(self, run: Timed) -> float:
        if isinstance(run, Pass):
            run.evict()  # untimed: the pass then reads its operands from memory
        t0 = self.clock()
        run()
        return self.clock() - t0

    def charge(self, seconds: float) -> None:
        """Add to `cost()` what choosing cost outside any one key's measurement: a probe a backend runs once to
        decide which candidates a key times."""
        if not seconds >= 0:
            raise ValueError(f"{self.name}: charged seconds must be >= 0, got {seconds!r}")
        with self._lock:
            self._charged += seconds

    def chosen(self) -> dict[Hashable, Choice]:
        """Every key measured so far in this process, and its choice."""
        return dict(self._chosen)

    def cost(self) -> float:
        """Seconds this process spent choosing: each key's measurement, and what was charged besides."""
        return self._charged + sum(choice.cost for choice in self._chosen.values())

    def clear(self) -> None:
        """Forget every choice, the charged cost and the CPU use: the next product of each key measures again."""
        with self._lock:
            self._chosen.clear()
            self.version += 1
            self._charged = 0.0
            self._load, self._warned = OthersBusy(), False
