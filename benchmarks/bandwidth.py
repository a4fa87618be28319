"""The machine's read bandwidth and matmul FLOP/s, each measured in a fresh process of its own.

They are the yardsticks benchmarks/cpu_decode.py sets its backends against. The read bandwidth is the best
1 GiB float32 matrix-vector product over torch's `mv`, XLA's dot and the project's CPU kernel (kernels/cpu/gemv.c):
the access pattern of a decode step, whose every weight is read once, so this rate / weight bytes per token is
the weight-streaming limit. The FLOP/s are a 2048x2048 float32 matrix product's. Medians of `--repeats` runs,
the variants taken in turn (interleaved_medians, which benchmarks/gemv_layout.py uses too).

A measurement runs in its own process (in_subprocess: `python -m benchmarks.bandwidth --worker machine` or
`--worker bandwidth`) so that no backend's threads, thread pools or memory are around while it reads; that process
prints its bandwidths, then one JSON line, which in_subprocess returns. A Probe (`--serve`) is such a process kept
for a whole benchmark run, asked for the bandwidth right beside each measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.worker import ROOT, Worker  # noqa: E402


def interleaved_medians(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each run, the runs taken in turn: a drift in the machine's bandwidth (these VMs
    drift by 10-20% within a minute) then hits every variant alike instead of whichever ran during it."""
    for run in runs.values():
        run()  # warm-up: compilation, allocator, caches
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def median_time(fn: Callable[[], object], repeats: int) -> float:
    return interleaved_medians({"": fn}, repeats)[""]


def matvec_readers() -> tuple[dict[str, Callable[[], object]], int]:
    """A 1 GiB float32 matrix-vector product (the access pattern of a decode step) per reader, and the bytes each
    reads: torch's `mv`, XLA's dot and, where it was built, the project's own CPU kernel (kernels/cpu/gemv.c), which
    both backends may choose for a decode step's products: a limit that left out the fastest reader the backends
    use would not be one. The kernel streams with the software fetch this process measured faster
    (kernels/cpu/gemv_fetch.py), as the backends' kernels do."""
    import jax
    import jax.numpy as jnp
    import torch

    from kernels.cpu import torch_gemv

    rows, cols = 16384, 16384
    a = torch.randn(rows, cols)
    x = torch.randn(cols)
    aj, xj = jnp.asarray(a.numpy()), jnp.asarray(x.numpy())
    mv = jax.jit(lambda m, v: m @ v)
    runs = {"torch": lambda: torch.mv(a, x), "jax": lambda: mv(aj, xj).block_until_ready()}
    if torch_gemv.supports(x[None], a, None):
        runs["kernel"] = lambda: torch_gemv.launch(x[None], a)  # [1, cols] @ a^T
    return runs, rows * cols * 4


def matvec_bandwidths(repeats: int) -> dict[str, float]:
    """Bytes/s of each reader of matvec_readers, medians of `repeats` runs taken in turn."""
    runs, nbytes = matvec_readers()
    return {name: nbytes / t for name, t in interleaved_medians(runs, repeats).items()}


def read_bandwidth(repeats: int) -> float:
    """The best 1 GiB matrix-vector bandwidth measured: the read rate a decode step could reach."""
    from kernels.cpu import gemv_fetch

    rates = matvec_bandwidths(repeats)
    choice = gemv_fetch.FETCH.chosen().get(("float32", "rows"))  # the kernel reader's
    kernel = f" (its fetch: {choice.path})" if choice else ""
    print("  matvec read bandwidth: " + ", ".join(f"{name} {rate / 1e9:.1f} GB/s" for name, rate in rates.items())
          + kernel)  # fmt: skip
    return max(rates.values())


def matmul_flops(repeats: int) -> float:
    import torch

    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / median_time(lambda: a @ b, repeats)


def worker(name: str, args: argparse.Namespace) -> dict:
    """The machine's bandwidth and FLOP/s, measured in this (fresh) process."""
    if name == "machine":
        return {"read_bandwidth": read_bandwidth(args.repeats), "matmul_flops": matmul_flops(args.repeats)}
    return {"read_bandwidth": read_bandwidth(args.repeats)}


def in_subprocess(name: str, args: argparse.Namespace) -> dict:
    """A machine measurement in its own process, so that no backend's threads or memory are around."""
    cmd = [sys.executable, "-m", "benchmarks.bandwidth", "--worker", name, "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    print("\n".join(lines[:-1]), flush=True)
    return json.loads(lines[-1])


def serve(repeats: int) -> None:
    """The probe of a benchmark's run (Probe): the readers are built once; each line on stdin is answered with one
    JSON line, the best of their bandwidths, medians of `repeats` runs."""
    runs, nbytes = matvec_readers()
    interleaved_medians(runs, 1)  # compilation, first touch of the matrices
    print(json.dumps({"ready": "probe"}), flush=True)
    for _ in sys.stdin:
        rates = {name: nbytes / t for name, t in interleaved_medians(runs, repeats).items()}
        print(json.dumps({"read_bandwidth": max(rates.values())}), flush=True)


class Probe(Worker):
    """The read bandwidth on demand, from a process of its own that holds its matrices for the whole run: a
    benchmark reads it right beside each measurement, so that a backend's rate is set against the bandwidth of
    the same minute (these VMs' read rate moves between ~25 and ~46 GB/s within seconds: docs/benchmarks.md)."""

    def __init__(self, repeats: int):
        super().__init__(["-m", "benchmarks.bandwidth", "--serve", "--repeats", str(repeats)])

    def read(self) -> float:
        """Bytes/s: the best reader's median, measured now."""
        return self.ask("read")["read_bandwidth"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help='"machine" (bandwidth and FLOP/s) or "bandwidth"')
    parser.add_argument("--serve", action="store_true", help="answer each line on stdin with a bandwidth (Probe)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.repeats)
        return 0
    if args.worker is None:
        parser.error("--worker or --serve is required")
    print(json.dumps(worker(args.worker, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
