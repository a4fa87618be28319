"""How much of the machine's CPUs other processes used over some stretches of time: what a measured choice of paths
(spec/path_choice.py) reports beside its result.

A choice times its candidates on the machine as it is at that moment. While another process holds the cores, the
paths that run on a team of threads wait for it at every call and the ranking can turn (docs/benchmarks.md records
a decode product's kernel timed 10x slower than F.linear under a test run, and 1.3-2x faster on the quiet machine);
the process then keeps a choice that is wrong once the other process stops. Such a choice is not an error, but it
must not pass unnoticed, so the share of the CPUs that other processes used while choosing is measured and told.

Linux only: /proc/stat's totals for the whole machine less this process's own CPU time. Elsewhere a sample is None
and the share unknown. The machine's counters advance in ticks (USER_HZ, 10 ms on common kernels), so a share is
only meaningful over much more than a tick: `OthersBusy` sums every stretch it is given, and says how long they were.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuSample:
    """Counters at one moment: CPU seconds the whole machine has been busy (user, nice, system, irq, softirq: not
    idle, I/O wait or a hypervisor's steal), CPU seconds this process has used (every thread), and the CPUs counted."""

    busy: float
    own: float
    cpus: int


def cpu_sample(stat: str = "/proc/stat") -> CpuSample | None:
    """The machine's and this process's CPU counters now; None where `stat` cannot be read or parsed."""
    try:
        with open(stat) as f:
            lines = f.read().splitlines()
        fields = lines[0].split()
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    except (OSError, IndexError, ValueError):
        return None
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    if fields[0] != "cpu" or cpus == 0:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return CpuSample((user + nice + system + irq + softirq) / tick, time.process_time(), cpus)


class OthersBusy:
    """The share of the CPUs that processes other than this one used, over every stretch `add` was given."""

    def __init__(self):
        self.seconds = 0.0  # wall time of the stretches
        self._others = 0.0  # CPU seconds other processes used in them
        self._capacity = 0.0  # CPU seconds the machine had in them

    def add(self, before: CpuSample | None, after: CpuSample | None, seconds: float) -> None:
        """One stretch of `seconds` between two samples; one that is missing (not Linux) adds nothing."""
        if before is None or after is None or not seconds > 0:
            return
        self.seconds += seconds
        self._others += (after.busy - before.busy) - (after.own - before.own)
        self._capacity += seconds * after.cpus

    def share(self) -> float | None:
        """Other processes' CPU time over the CPU time the machine had, in [0, 1] (the counters' ticks can put the
        raw ratio a little outside it); None before any stretch."""
        if self._capacity <= 0:
            return None
        return min(1.0, max(0.0, self._others / self._capacity))
