"""Load time of the Qwen3-0.6B-shaped checkpoint (2.38 GB float32), both backends, with and without the
non-finite scan: what the stricter loading of issue 17 costs.

Every load validates the checkpoint from its headers (spec/validate.py) and, by default, scans each tensor for
NaN/Inf as it reads it (spec/checkpoint.py); `allow_nonfinite_weights()` turns only the scan off. The two
variants run in turn, load after load (a drift of the machine's speed then hits both alike), after one
unmeasured load of each backend that brings the file into the page cache. Prints medians, each backend's
ratio scan/no-scan and the machine; `--json PATH` writes the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks import machine as machine_info  # noqa: E402
from benchmarks.qwen3_shape import qwen3_0_6b_checkpoint  # noqa: E402
from spec import allow_nonfinite_weights  # noqa: E402


def load_seconds(backend: str, directory: Path, scan: bool) -> float:
    package = __import__(backend)
    start = time.perf_counter()
    with allow_nonfinite_weights(not scan):
        model = package.from_pretrained(directory, "float32")
    seconds = time.perf_counter() - start
    del model
    gc.collect()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", default="torch_impl,jax_impl")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    directory = qwen3_0_6b_checkpoint("float32")
    print(machine_info.line())
    results = {}
    for backend in args.backends.split(","):
        load_seconds(backend, directory, scan=False)  # page cache, imports, first-call costs
        times = {"scan": [], "no_scan": []}
        for repeat in range(args.repeats):
            for variant in ("scan", "no_scan"):
                times[variant].append(load_seconds(backend, directory, scan=variant == "scan"))
            print(f"  {backend} load {repeat + 1}/{args.repeats}", file=sys.stderr, flush=True)
        scan, plain = statistics.median(times["scan"]), statistics.median(times["no_scan"])
        ratios = [a / b for a, b in zip(times["scan"], times["no_scan"], strict=True)]
        results[backend] = {
            "scan_s": times["scan"],
            "no_scan_s": times["no_scan"],
            "median_ratio": statistics.median(ratios),
        }
        print(
            f"{backend:10s} load {scan:.2f} s with the scan, {plain:.2f} s without (medians of {args.repeats}); "
            f"scan/no-scan {statistics.median(ratios):.3f} (pairwise median, range {min(ratios):.3f}-{max(ratios):.3f})"
        )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info.describe(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
