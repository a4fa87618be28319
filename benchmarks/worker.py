"""A benchmark's worker: a Python process of the project's own, kept for a whole run and spoken to in lines.

benchmarks/cpu_decode.py keeps one per backend (each loads its model once, then answers "run" with one generation's
figures) and one bandwidth probe (benchmarks/bandwidth.py's Probe). The worker prints one JSON line when it is ready,
then answers every line written to it with one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Worker:
    def __init__(self, args: list[str]):
        """Start `python *args` in the repository's root and wait for its first line (it is ready)."""
        self.proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.ready = json.loads(self.proc.stdout.readline())

    def ask(self, command: str) -> dict:
        """Write `command` as one line; return the worker's one-line JSON answer."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        """End its input and wait for it to exit."""
        self.proc.stdin.close()
        self.proc.wait()
