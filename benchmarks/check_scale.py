"""Memory and time of the parity check as the checkpoint grows: whole-model vs layer-streamed (issue 16).

Random bf16 Qwen3 checkpoints of three sizes (0.6B, 1.7B, 8B: benchmarks/scale_checkpoints.py, written once
into the cache) and the 8B shape with 4 layers. For each, `python -m parity check PATH --dtype bfloat16
--seq-len 64` (float32 baseline included, as the command runs by default) in its own process, streamed always
and whole-model where its estimated memory (parity/memory.py) fits in what the machine has available: the
process's peak RSS (ru_maxrss: anonymous memory and the checkpoint's pages mapped in), the check's wall time
and seconds per layer. A streamed check runs both modes at once, free-running and teacher-forced; its time is
that of both, and both modes' errors at the last layer are printed.

Floors: the streamed check's peak RSS at 8B <= 4 GB; adding layers of one size adds less than one layer's
float32 bytes to it (8B vs 8B-4l: it grows with the size of a layer, not the number); and its wall time <=
1.2x the whole-model check's where both run. The machine's load is printed: the 2-core machines these run
on are shared, and time is only comparable within a quiet run.

    python benchmarks/check_scale.py [--sizes 0.6b,1.7b,8b-4l,8b] [--seq-len 64] [--json PATH] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks import machine
from benchmarks.scale_checkpoints import SIZES, checkpoint_bytes, scale_checkpoint
from spec.layerwise import layer_prefix
from spec.params import param_table

REPO = Path(__file__).resolve().parents[1]
FLOOR_8B_RSS_GB = 4.0
FLOOR_WALL_RATIO = 1.2


def _one(path: str, stream: bool, seq_len: int) -> dict:
    """In the child process: one check; its wall time, peak RSS and what it found."""
    import resource

    import parity

    start = time.perf_counter()
    report = parity.check(
        path, dtype="bfloat16", seq_len=seq_len, stream=stream, progress=True, log=lambda line: _err(f"  {line}")
    )
    wall = time.perf_counter() - start
    out = {
        "wall_s": wall,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,  # KiB -> GB (10^9 bytes)
        "passed": report.passed,
        "mode": report.mode,
        "timings": report.timings,
        "first_divergence": report.first_divergence,
    }
    last = f"layers.{report.num_layers - 1}.x2"
    modes = [("free_running", report.comparisons[0])] + [("teacher_forced", c) for c in report.teacher_forced[:1]]
    for mode, comparison in modes:
        out[mode] = {name: comparison.result(name).metrics.max_rel for name in (last, "logits")}
    return out


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def measure(path: Path, stream: bool, seq_len: int) -> dict:
    """One check in a fresh process (a peak is per process); its progress goes to this terminal."""
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from benchmarks.check_scale import _one\n"
        f"print(json.dumps(_one({str(path)!r}, {stream}, {seq_len})))\n"
    )
    _err(f"[check_scale] {path.name}: {'streamed' if stream else 'whole-model'} check ...")
    result = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the check of {path} failed (exit {result.returncode}); its stderr is above")
    return json.loads(result.stdout.strip().splitlines()[-1])


def whole_fits(path: Path, seq_len: int) -> tuple[bool, float, float]:
    """(fits, estimated GiB, available GiB) for the whole-model check, as `check` decides on its own."""
    from parity.memory import available_bytes, whole_check_bytes
    from parity.request import validate_request

    request = validate_request(path, "bfloat16", "reference", None, None, None, seq_len, None, 0, None, 1)
    need, have = whole_check_bytes(request), available_bytes() or 0
    return need <= have, need / 2**30, have / 2**30


def layer_bytes(size: str) -> int:
    """One decoder layer's parameters in float32 (the float32 baseline's pieces are the largest)."""
    spec = SIZES[size]
    return 4 * sum(int(_count(e.shape)) for e in param_table(spec) if e.name.startswith(layer_prefix(0)))


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def run(sizes: list[str], seq_len: int, cache: Path | None) -> dict:
    out: dict = {"machine": machine.describe(), "load_at_start": os.getloadavg(), "seq_len": seq_len, "sizes": {}}
    for size in sizes:
        path = scale_checkpoint(size, cache)
        row: dict = {"layers": SIZES[size].num_hidden_layers, "layer_gb_f32": layer_bytes(size) / 1e9}
        row["checkpoint_gb"] = checkpoint_bytes(SIZES[size]) / 1e9
        row["streamed"] = measure(path, True, seq_len)
        fits, need, have = whole_fits(path, seq_len)
        row["whole_estimate_gib"], row["available_gib"] = need, have
        if fits:
            row["whole"] = measure(path, False, seq_len)
            row["wall_ratio"] = row["streamed"]["wall_s"] / row["whole"]["wall_s"]
        out["sizes"][size] = row
    out["load_at_end"] = os.getloadavg()
    out["floors"] = floors(out["sizes"])
    return out


def floors(rows: dict) -> dict:
    result = {}
    if "8b" in rows:
        rss = rows["8b"]["streamed"]["peak_rss_gb"]
        result["8b_streamed_peak_rss_le_4gb"] = {"value_gb": rss, "passed": rss <= FLOOR_8B_RSS_GB}
    if "8b" in rows and "8b-4l" in rows:
        grow = (rows["8b"]["streamed"]["peak_rss_gb"] - rows["8b-4l"]["streamed"]["peak_rss_gb"]) * 1e9
        limit = layer_bytes("8b")
        result["32_more_layers_add_less_than_one_layer"] = {"added_gb": grow / 1e9, "passed": grow < limit}
    ratios = {size: row["wall_ratio"] for size, row in rows.items() if "wall_ratio" in row}
    if ratios:
        result["streamed_wall_le_1.2x_whole"] = {"ratios": ratios, "passed": max(ratios.values()) <= FLOOR_WALL_RATIO}
    return result


def print_table(out: dict) -> None:
    print(f"{machine.line()}; load average {out['load_at_start'][0]:.2f} at start, {out['load_at_end'][0]:.2f} at end")
    head = f"{'size':>6} {'layers':>6} {'layer GB':>9} {'ckpt GB':>8} {'check':>9} {'peak RSS GB':>12} {'wall s':>8}"
    print(head + f" {'s/layer':>8} {'x2 err free / forced':>22} {'passed':>7}")
    for size, row in out["sizes"].items():
        for mode in ("whole", "streamed"):
            r = row.get(mode)
            if r is None:
                need, have = row["whole_estimate_gib"], row["available_gib"]
                print(f"{size:>6} {'whole':>36}  skipped: needs ~{need:.0f} GiB, {have:.0f} GiB available")
                continue
            last = f"layers.{row['layers'] - 1}.x2"
            errors = f"{r['free_running'][last]:.2e}"
            errors += f" / {r['teacher_forced'][last]:.2e}" if "teacher_forced" in r else ""
            print(
                f"{size:>6} {row['layers']:>6} {row['layer_gb_f32']:>9.2f} {row['checkpoint_gb']:>8.1f} {mode:>9} "
                f"{r['peak_rss_gb']:>12.2f} {r['wall_s']:>8.1f} {r['wall_s'] / row['layers']:>8.2f} {errors:>22} "
                f"{str(r['passed']):>7}"
            )
        if "wall_ratio" in row:
            print(f"{size:>6} streamed / whole wall time: {row['wall_ratio']:.2f}x")
    for name, floor in out["floors"].items():
        print(f"floor {name}: {'PASS' if floor['passed'] else 'FAIL'} {json.dumps(floor)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0.6b,1.7b,8b-4l,8b", help="comma-separated keys of SIZES")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--cache", type=Path, default=None, help="checkpoint cache (default: the project's)")
    args = parser.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"unknown sizes {unknown}; choose from {', '.join(SIZES)}")
    out = run(sizes, args.seq_len, args.cache)
    print_table(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
