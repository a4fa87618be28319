"""When `check` streams on its own: the whole-model check's memory, estimated, against what the machine has.

The whole-model check (parity/api.py) holds one model at a time, but a whole one: at its peak the largest
model it loads (float32 when a bf16/fp16 check has its float32 baseline), the checkpoint's pages the loader
maps while reading it, both traces (parity/inputs.py: `run_bytes`) and the frameworks themselves. Measured
on a Qwen3-0.6B-shaped bf16 checkpoint, that is about 5 GB; on an 8B one, 50 GB. When the estimate exceeds
the memory available now (psutil's `available`, else /proc/meminfo's MemAvailable, else the free pages;
bounded by a cgroup's limit), `check` runs the layer-streamed check instead (parity/stream.py) and says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from parity.inputs import run_bytes
from spec import Checkpoint, parameter_count

RUNTIME_BYTES = 1 << 30  # torch, JAX and their allocators once loaded (about 0.8 GB measured), rounded up
_CGROUP = Path("/sys/fs/cgroup")


def whole_check_bytes(request) -> int:
    """The estimated peak memory of the whole-model check of `request` (a parity.request.Request)."""
    widest = 4 if (request.baseline or request.dtype == "float32") else 2  # bytes per parameter of the largest model
    checkpoint = Checkpoint(request.directory)
    mapped = sum(checkpoint.nbytes(name) for name in checkpoint.names())
    return RUNTIME_BYTES + parameter_count(request.spec) * widest + mapped + run_bytes(request.spec, *request.ids.shape)


def available_bytes() -> int | None:
    """Memory this process can use now without swapping: the system's available memory, capped by a cgroup."""
    system = _system_available()
    limit = _cgroup_room()
    candidates = [n for n in (system, limit) if n is not None]
    return min(candidates) if candidates else None


def _system_available() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_room() -> int | None:
    """cgroup v2: memory.max minus memory.current, when a limit is set (a container, a CI runner)."""
    try:
        limit = (_CGROUP / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((_CGROUP / "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def should_stream(request, say: Callable[[str], None]) -> bool:
    """True when the whole-model check of `request` would not fit in the memory available (and says why)."""
    need, have = whole_check_bytes(request), available_bytes()
    if have is None or need <= have:
        return False
    say(
        f"the whole-model check needs about {need / 2**30:.1f} GiB (the largest model, the checkpoint's pages, the "
        f"traces), more than the {have / 2**30:.1f} GiB available: streaming one layer at a time instead (--stream)"
    )
    return True
