"""Peak memory of one torch rank loading the Qwen3-0.6B-shaped checkpoint at tp = 1, 2 and 4.

Each rank reads only its slices of the memory-mapped safetensors files (spec/parallel.py), so its private
(anonymous) memory should fall with the degree: about 1/tp of the weights plus the replicated norms and the
runtime. Prints, per degree, the largest rank's peak RSS (`ru_maxrss`: includes the file pages it touched
through the memory map, which the kernel can drop) and its private memory after loading (RssAnon), and the
ratios to tp = 1 measured in the same run.

    python benchmarks/tp_memory.py [float32|bfloat16]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks import machine
from benchmarks.qwen3_shape import qwen3_0_6b_checkpoint


def rss_anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _load(path: str, dtype: str) -> dict:
    import torch.distributed as dist

    import torch_impl

    group = dist.group.WORLD if dist.is_initialized() else None
    model = torch_impl.from_pretrained(path, dtype, group=group)
    params = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_anon_mb": rss_anon_mb()}
    out["param_mb"] = params
    if group is None:
        return out
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, out)
    return gathered


def measure(path: Path, dtype: str, tp: int) -> dict:
    """The rank with the largest peak, in a fresh process per degree (peaks are per process)."""
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from benchmarks.tp_memory import _load\n"
        "from torch_impl.tp_launch import run_tp\n"
        f"out = _load({str(path)!r}, {dtype!r}) if {tp} == 1 else run_tp(_load, {tp}, {str(path)!r}, {dtype!r})\n"
        "print(json.dumps(out if isinstance(out, list) else [out]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ranks = json.loads(result.stdout.strip().splitlines()[-1])
    return max(ranks, key=lambda r: r["peak_rss_mb"])


def main() -> None:
    dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
    path = qwen3_0_6b_checkpoint(dtype)
    print(f"{machine.line()}; checkpoint {path.name}")
    rows = {tp: measure(path, dtype, tp) for tp in (1, 2, 4)}
    base = rows[1]
    print(f"{'tp':>3} {'params MB':>10} {'peak RSS MB':>12} {'ratio':>6} {'RssAnon MB':>11} {'ratio':>6}")
    for tp, r in rows.items():
        print(
            f"{tp:>3} {r['param_mb']:>10.0f} {r['peak_rss_mb']:>12.0f} {r['peak_rss_mb'] / base['peak_rss_mb']:>6.2f} "
            f"{r['rss_anon_mb']:>11.0f} {r['rss_anon_mb'] / base['rss_anon_mb']:>6.2f}"
        )
    print(json.dumps({"machine": machine.describe(), "dtype": dtype, "per_tp": rows}))


if __name__ == "__main__":
    main()
