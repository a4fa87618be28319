"""A small progress line on stderr for long work (loading a multi-GB checkpoint, a benchmark).

No dependency and no global state: a `Progress` is created by the loop that owns the work and prints
at most a few times a second; disabled, it costs nothing.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: float, desc: str, *, enabled: bool = True, unit: str = ""):
        self.total, self.desc, self.enabled, self.unit = total, desc, enabled, unit
        self.done = 0.0
        self._start = self._last = time.perf_counter()

    def _fmt(self, value: float) -> str:
        if self.unit == "B":
            return f"{value / 1e9:.2f} GB" if value >= 1e8 else f"{value / 1e6:.1f} MB"
        return f"{value:g}"

    def update(self, amount: float = 1) -> None:
        self.done += amount
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.25 or self.done >= self.total):
            self._last = now
            pct = 100.0 * self.done / self.total if self.total else 100.0
            sys.stderr.write(
                f"\r{self.desc}: {pct:5.1f}% ({self._fmt(self.done)} / {self._fmt(self.total)}) "
                f"{now - self._start:.1f}s"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write(
                f"\r{self.desc}: done ({self._fmt(self.done)}) in {time.perf_counter() - self._start:.1f}s\n"
            )
            sys.stderr.flush()
