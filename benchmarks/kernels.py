"""Speed of the fused kernels (Triton for torch, Pallas for JAX) against the framework ops they replace, on a GPU.

For each kernel, dtype (bf16 by default) and [tokens x width] shape it prints the time per call, the achieved
bandwidth (bytes the op must read + write, divided by the time), and that bandwidth as a fraction of the
device-to-device copy bandwidth measured in the same run and of the spec peak, for three variants:

    fused      the Triton / Pallas kernel
    plain      the reference run op by op (eager torch, eager jax.numpy): the framework ops the kernel replaces
    compiled   the reference through torch.compile / jax.jit, which may fuse it as well

The ops are memory-bound, so bandwidth is the figure of merit. Where the sweep includes their shape (bf16,
width 4096, >= 4096 tokens) it evaluates and prints the fused kernels' floors: >= 85% of the copy bandwidth,
and >= 1.3x the plain ops. `--json PATH` writes every figure and the floors.

    python benchmarks/kernels.py                      # both frameworks, where each has a GPU; the full sweep
    python benchmarks/kernels.py --framework torch --tokens 1,4096 --widths 4096
    python benchmarks/kernels.py --kernels add_rms_norm_gemma,gelu_tanh_and_mul      # issue 15's family kernels
    python benchmarks/kernels.py --tokens 4096,16384 --widths 4096 --json k.json   # what gpu_check.sh runs

The parts: benchmarks/kernel_timing.py (GPU detection, the timing loops), benchmarks/kernels_torch.py and
benchmarks/kernels_jax.py (each framework's cases and sweep), benchmarks/kernel_figures.py (bytes moved, the
records, the sweep loop, the floors, the JSON); benchmarks/gpu_report.py reads the JSON back for gpu_check.sh.

Without a GPU it says so and exits 0 (2 with --require-gpu): interpret-mode (CPU) timings would measure the
interpreter, not the kernels. A framework whose sweep fails is named in the JSON's "skipped" with its error, the
other still measured, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import platform
import sys
import traceback
from pathlib import Path
from typing import Any

# This script is named like the package it measures: without this, `import kernels` would import the script.
# (Run as a file, it also puts the repository on the path for the `benchmarks` imports below.)
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from benchmarks.kernel_figures import DEFAULT_KERNELS, KERNELS, evaluate_floors, print_floors, save  # noqa: E402
from benchmarks.kernel_timing import jax_gpu, torch_gpu  # noqa: E402
from benchmarks.kernels_jax import bench_jax  # noqa: E402
from benchmarks.kernels_torch import bench_torch  # noqa: E402

NO_GPU = (
    "benchmarks/kernels.py needs a GPU: none found for {searched}. Interpret-mode (CPU) timings would measure "
    "the interpreter, not the kernels; nothing measured."
)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _kernel_names(text: str) -> list[str]:
    names = [v for v in text.split(",") if v]
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown kernel(s) {unknown}; choose from {', '.join(KERNELS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=["torch", "jax", "both"], default="both")
    parser.add_argument(
        "--kernels", type=_kernel_names, default=list(DEFAULT_KERNELS), help=f"any of {', '.join(KERNELS)}"
    )
    parser.add_argument("--tokens", type=_ints, default=[1, 16, 256, 4096, 32768])
    parser.add_argument("--widths", type=_ints, default=[1024, 2048, 4096, 8192])
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls first (compilation, autotuning)")
    parser.add_argument("--samples", type=int, default=20, help="timed samples; the median is reported")
    parser.add_argument("--calls", type=int, default=10, help="back-to-back calls per timed sample")
    parser.add_argument("--peak-gbps", type=float, default=None, help="spec memory bandwidth, if not in the table")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure and the floors here")
    parser.add_argument("--require-gpu", action="store_true", help="exit 2 (not 0) when no GPU is found")
    args = parser.parse_args(argv)

    # JAX's GPU client first: where torch loads its CUDA libraries first, a jaxlib built against a newer cuDNN than
    # the one torch loaded starts without its GPU.
    run_jax = args.framework in ("jax", "both") and jax_gpu()
    run_torch = args.framework in ("torch", "both") and torch_gpu()
    if not (run_torch or run_jax):
        print(NO_GPU.format(searched="torch or jax" if args.framework == "both" else args.framework))
        return 2 if args.require_gpu else 0
    from benchmarks.machine import describe, line

    print(line())  # the host: the GPU figures come from the device, but say where they were taken
    out: dict[str, Any] = {
        "host": platform.node(),
        "machine": describe(),
        "devices": {},
        "versions": {"python": platform.python_version()},
        "copy_gbps": {},
        "spec_peak_gbps": {},
        "settings": {key: getattr(args, key) for key in ("dtype", "warmup", "samples", "calls", "tokens", "widths")},
        "skipped": {},
        "results": [],
    }
    for name, wanted, found in (("torch", "torch", run_torch), ("jax", "jax", run_jax)):
        if args.framework in (wanted, "both") and not found:
            out["skipped"][name] = "no GPU visible to it"
    failed = False
    try:
        for name, bench, run in (("torch", bench_torch, run_torch), ("jax", bench_jax, run_jax)):
            if not run:
                continue
            try:
                bench(args, out)
            except Exception as err:  # one framework's failure (a compile, a CUDA error) leaves the other's figures
                failed = True
                traceback.print_exc()
                out["skipped"][name] = f"failed: {type(err).__name__}: {err}"
                print(f"{name}: FAILED ({type(err).__name__}: {err}); its figures so far are kept, the rest is missing")
    except KeyboardInterrupt:  # gpu_check.sh's time budget (SIGINT): the floors of what was measured, and the JSON
        print("interrupted: the floors below are evaluated on the shapes measured so far")
        out["skipped"]["interrupted"] = "stopped by SIGINT (gpu_check.sh's time budget) before every shape was measured"
    out["floors"] = evaluate_floors(out["results"])
    out["floors_passed"] = all(f["passed"] for f in out["floors"]) if out["floors"] else None
    print_floors(out["floors"])
    save(args, out)
    if args.json is not None:
        print(f"figures written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
