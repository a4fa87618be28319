"""The machine a figure was measured on: processor model, cores and the instruction-set flags that decide
which CPU path is fast (AVX2, AVX-512, AVX512_BF16, AMX), and any cap on the instructions the libraries may use
(.ci/run holds them to AVX2 to stand in for an AVX2-only processor). Every benchmark prints this with its figures."""

from __future__ import annotations

import os
import platform
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
CAP_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def describe() -> dict:
    """{"processor", "cpu_id", "cores", "flags"} from /proc/cpuinfo (lscpu's "Model name"; its family, model and
    stepping numbers, which name the generation where a VM's model name is a generic "Intel(R) Xeon(R) Processor"), or
    what platform knows."""
    model, flags, ids = platform.processor() or platform.machine(), set(), {}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
            elif key.strip() in ("cpu family", "model", "stepping"):
                ids.setdefault(key.strip().removeprefix("cpu "), value.strip())
    cpu_id = " ".join(f"{k} {v}" for k, v in ids.items())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    flags_here = [f for f in FLAGS if f in flags]
    return {"processor": model, "cpu_id": cpu_id, "cores": cores, "flags": flags_here, "isa_caps": isa_caps()}


def isa_caps() -> dict[str, str]:
    """The instruction-set caps set for torch (ATen), oneDNN, MKL and XLA in this process's environment: with them
    a processor's flags overstate what the libraries ran."""
    caps = {name: os.environ[name] for name in CAP_VARIABLES if os.environ.get(name)}
    xla = [f for f in os.environ.get("XLA_FLAGS", "").split() if f.startswith("--xla_cpu_max_isa=")]
    return {**caps, **({"XLA_FLAGS": xla[-1]} if xla else {})}


def line() -> str:
    m = describe()
    caps = " ".join(f"{k}={v}" for k, v in m["isa_caps"].items())
    name = f"{m['processor']} ({m['cpu_id']})" if m["cpu_id"] else m["processor"]
    text = f"machine: {name}, {m['cores']} cores, flags {' '.join(m['flags']) or '(none of interest)'}"
    return f"{text}; libraries capped: {caps}" if caps else text


if __name__ == "__main__":
    print(line())
