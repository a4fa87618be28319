"""spec/cpu_load.py: other processes' share of the CPUs, from /proc/stat-shaped counters (known answers on files
written here) and from this machine's own."""

from __future__ import annotations

import os
import sys
import time

import pytest

from spec.cpu_load import CpuSample, OthersBusy, cpu_sample

STAT = """cpu  {user} 10 {system} 900000 50 {irq} {softirq} 7 0 0
cpu0 1 0 1 1 0 0 0 0 0 0
cpu1 1 0 1 1 0 0 0 0 0 0
cpu2 1 0 1 1 0 0 0 0 0 0
intr 12345
"""


def test_sample_reads_busy_ticks_and_counts_the_cpus(tmp_path):
    """busy = user + nice + system + irq + softirq (not idle, I/O wait or steal), in seconds of USER_HZ ticks."""
    path = tmp_path / "stat"
    path.write_text(STAT.format(user=300, system=50, irq=3, softirq=7))
    sample = cpu_sample(str(path))
    assert sample.busy == pytest.approx((300 + 10 + 50 + 3 + 7) / os.sysconf("SC_CLK_TCK"))
    assert sample.cpus == 3 and sample.own >= 0


@pytest.mark.parametrize("text", ["", "cpu 1 2\n", "intr 1 2 3 4 5 6 7 8\ncpu0 1 1 1 1 1 1 1\n", "cpu a b c d e f g\n"])
def test_an_unreadable_or_foreign_stat_gives_none(tmp_path, text):
    path = tmp_path / "stat"
    path.write_text(text)
    assert cpu_sample(str(path)) is None
    assert cpu_sample(str(tmp_path / "missing")) is None


def test_share_sums_the_stretches_and_stays_in_range():
    busy = OthersBusy()
    assert busy.share() is None
    busy.add(CpuSample(10.0, 1.0, 4), CpuSample(13.0, 2.0, 4), 1.0)  # others: 3 - 1 = 2 CPU s of 4
    busy.add(CpuSample(20.0, 5.0, 4), CpuSample(21.0, 6.0, 4), 1.0)  # others: 0 of 4
    assert busy.share() == pytest.approx(2 / 8) and busy.seconds == 2.0
    busy.add(None, CpuSample(0, 0, 4), 5.0)  # a missing sample adds nothing
    assert busy.share() == pytest.approx(2 / 8) and busy.seconds == 2.0
    tick_error = OthersBusy()
    tick_error.add(CpuSample(0.0, 0.0, 2), CpuSample(0.99, 1.0, 2), 0.5)  # counters a tick behind our own clock
    assert tick_error.share() == 0.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_this_machine_counts_this_process_busy():
    """A stretch in which this process spins: the machine's counters see it busy. (Loosely: on a VM the time a
    hypervisor steals can count as this process's but as steal, not busy, in the machine's counters.) The spin is
    counted in this process's CPU time, not the wall clock's, so a busy machine only makes it take longer."""
    before, start = cpu_sample(), time.process_time()
    while time.process_time() - start < 0.3:
        pass
    after = cpu_sample()
    assert before is not None and after is not None and after.cpus >= 1
    own = after.own - before.own
    assert own > 0.2
    assert after.busy - before.busy >= 0.5 * own
