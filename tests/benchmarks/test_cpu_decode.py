"""benchmarks/cpu_decode.py's own command line: a `--jax-compilation-cache` that is not a usable directory is refused
before any worker starts. (The backends' processes, and the option's effect: test_decode_backend.py.)"""

from __future__ import annotations

import subprocess
import sys

from benchmarks.worker import ROOT


def test_a_cache_path_that_is_not_a_directory_is_refused_before_any_worker_starts(tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cpu_decode", "--jax-compilation-cache", str(taken)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"--jax-compilation-cache {taken}: not a usable directory" in done.stderr
    assert "Traceback" not in done.stderr
