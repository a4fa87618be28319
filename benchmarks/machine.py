"""The machine a figure was measured on: processor model, cores and the instruction-set flags that decide
which CPU path is fast (AVX2, AVX-512, AVX512_BF16, AMX). Every benchmark prints this with its figures."""

from __future__ import annotations

import os
import platform
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def describe() -> dict:
    """{"processor", "cores", "flags"} from /proc/cpuinfo (lscpu's "Model name"), or what platform knows."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"processor": model, "cores": cores, "flags": [f for f in FLAGS if f in flags]}


def line() -> str:
    m = describe()
    return f"machine: {m['processor']}, {m['cores']} cores, flags {' '.join(m['flags']) or '(none of interest)'}"


if __name__ == "__main__":
    print(line())
