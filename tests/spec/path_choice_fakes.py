"""The fake clock (and CPU counters) that tests/spec/test_path_choice*.py decide choices on: each candidate advances
the clock by a set amount, so every decision is exact."""

from __future__ import annotations

from spec.cpu_load import CpuSample
from spec.path_choice import PathChoice


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def candidate(self, seconds: float, calls: list[str], name: str):
        def run() -> None:
            calls.append(name)
            self.now += seconds

        return run

    def rounds(self, seconds: list[float], calls: list[str], name: str):
        """A candidate whose n-th run (the warm-up first) takes seconds[n]."""
        left = iter(seconds)

        def run() -> None:
            calls.append(name)
            self.now += next(left)

        return run


def make(clock: FakeClock, **kwargs) -> PathChoice:
    """A choice on the fake clock; the machine's real CPU counters are not sampled unless a test passes `cpu`."""
    return PathChoice("test", ("plain", "other"), clock=clock, **({"cpu": None} | kwargs))


class FakeCpu:
    """CPU counters on the fake clock: over each second of it, the other processes use `others` CPU seconds and
    this one `own`, on `cpus` CPUs."""

    def __init__(self, clock: FakeClock, others: float, own: float = 1.0, cpus: int = 4):
        self.clock, self.others, self.own, self.cpus = clock, others, own, cpus

    def __call__(self) -> CpuSample:
        t = self.clock.now
        return CpuSample(busy=(self.others + self.own) * t, own=self.own * t, cpus=self.cpus)
