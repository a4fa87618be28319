"""Speed of the fused kernels (Triton for torch, Pallas for JAX) against the unfused references, on a GPU.

For each kernel, dtype (bf16 by default) and [tokens x width] shape it prints the median time, the achieved
bandwidth (bytes the op must read + write, divided by the time), that bandwidth as a fraction of the
device-to-device copy bandwidth measured in the same run and of the spec peak, and the same numbers for
the unfused reference run op by op (eager) and compiled (torch.compile / jax.jit), measured in the same run.
Both ops are memory-bound, so bandwidth is the figure of merit.

    python benchmarks/kernels.py                      # both frameworks, where each has a GPU
    python benchmarks/kernels.py --framework torch --tokens 1,4096 --widths 4096

Without a GPU it says so and exits 0: interpret-mode timings would measure the interpreter, not the kernel.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# This script is named like the package it measures: without this, `import kernels` would import the script.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

EPS = 1e-6
# Spec HBM bandwidth in GB/s by device-name fragment (first match wins); --peak-gbps overrides.
SPEC_PEAK_GBPS = {
    "H200": 4800.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100-SXM4-80GB": 2039.0,
    "A100": 1555.0,
    "L40S": 864.0,
    "L4": 300.0,
    "A10G": 600.0,
    "RTX 4090": 1008.0,
    "MI300X": 5300.0,
}


def _torch_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _jax_gpu() -> bool:
    try:
        import jax
    except ImportError:
        return False
    return any(d.platform in ("gpu", "cuda", "rocm") for d in jax.devices())


def _spec_peak(device_name: str, override: float | None) -> float | None:
    if override is not None:
        return override
    return next((gbps for key, gbps in SPEC_PEAK_GBPS.items() if key in device_name), None)


def _bytes_moved(kernel: str, tokens: int, width: int, itemsize: int) -> int:
    if kernel == "add_rms_norm":  # read x, residual, weight; write out, new residual
        return (4 * tokens * width + width) * itemsize
    return 3 * tokens * width * itemsize  # silu_and_mul: read [T, 2I], write [T, I]; width is I


def _report(seconds: dict[str, float], nbytes: int, copy_gbps: float, peak: float | None) -> None:
    """One line per variant (fused, eager, compiled), then the fused kernel's speedups."""
    for label, t in seconds.items():
        gbps = nbytes / t / 1e9
        peak_txt = f"{gbps / peak:6.1%}" if peak else "   n/a"
        print(f"    {label:<9} {t * 1e6:10.1f} us {gbps:8.1f} GB/s {gbps / copy_gbps:7.1%} of copy {peak_txt} of peak")
    fused = seconds["fused"]
    print(f"    fused is {seconds['eager'] / fused:.2f}x eager, {seconds['compiled'] / fused:.2f}x compiled")


def _median_seconds_cuda(fn: Callable[[], object], warmup: int, reps: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)  # ms -> s
    return statistics.median(times)


def _median_seconds_jax(fn: Callable[[], object], warmup: int, reps: int) -> float:
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _torch_cases(kernel: str, tokens: int, width: int, dtype, compiled: dict) -> dict[str, Callable[[], object]]:
    import torch

    from kernels.triton import add_rms_norm, add_rms_norm_reference, silu_and_mul, silu_and_mul_reference

    if kernel == "add_rms_norm":
        x, r = (torch.randn(tokens, width, device="cuda", dtype=dtype) for _ in range(2))  # [T, H] each
        w = torch.randn(width, device="cuda", dtype=dtype)
        return {
            "fused": lambda: add_rms_norm(x, r, w, EPS),
            "eager": lambda: add_rms_norm_reference(x, r, w, EPS),
            "compiled": lambda: compiled[kernel](x, r, w, EPS),
        }
    x = torch.randn(tokens, 2 * width, device="cuda", dtype=dtype)  # [T, 2I]
    return {
        "fused": lambda: silu_and_mul(x),
        "eager": lambda: silu_and_mul_reference(x),
        "compiled": lambda: compiled[kernel](x),
    }


def bench_torch(args: argparse.Namespace) -> None:
    import torch

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("torch: skipped, TRITON_INTERPRET is set: the Triton kernels would run in the CPU interpreter")
        return

    from kernels.triton import add_rms_norm_reference, silu_and_mul_reference

    dtype = getattr(torch, args.dtype)
    name = torch.cuda.get_device_name()
    peak = _spec_peak(name, args.peak_gbps)
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
    dst = torch.empty_like(src)
    copy_gbps = 2 * src.numel() / _median_seconds_cuda(lambda: dst.copy_(src), args.warmup, args.reps) / 1e9
    print(f"torch {torch.__version__} on {name}: copy {copy_gbps:.0f} GB/s, spec peak {peak or 'unknown'} GB/s")
    # One compiled graph per shape: raise dynamo's recompile limit (renamed across torch versions) above the sweep.
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 64))
    compiled = {
        "add_rms_norm": torch.compile(add_rms_norm_reference),
        "silu_and_mul": torch.compile(silu_and_mul_reference),
    }
    with torch.inference_mode():
        for kernel in args.kernels:
            for width in args.widths:
                for tokens in args.tokens:
                    nbytes = _bytes_moved(kernel, tokens, width, dtype.itemsize)
                    print(f"  torch {kernel} {args.dtype} [{tokens} x {width}]  ({nbytes / 1e6:.1f} MB moved)")
                    cases = _torch_cases(kernel, tokens, width, dtype, compiled)
                    seconds = {label: _median_seconds_cuda(fn, args.warmup, args.reps) for label, fn in cases.items()}
                    _report(seconds, nbytes, copy_gbps, peak)


def _jax_cases(kernel: str, tokens: int, width: int, dtype, device, jitted: dict) -> dict[str, Callable[[], object]]:
    import jax
    import jax.numpy as jnp

    from kernels.pallas import add_rms_norm_reference, silu_and_mul_reference

    keys = jax.random.split(jax.random.key(0))
    if kernel == "add_rms_norm":
        x, r = (jax.device_put(jax.random.normal(k, (tokens, width), dtype), device) for k in keys)  # [T, H] each
        w = jax.device_put(jnp.ones(width, dtype), device)
        state = {"fused": jnp.copy(r), "compiled": jnp.copy(r)}  # donated buffers, apart from r

        def chained(label: str) -> Callable[[], object]:
            # The residual is donated and fed back, as a decoder would, so that input_output_aliases can
            # update it in place; without donation XLA must copy it first.
            def step() -> object:
                out, state[label] = jitted[label](x, state[label], w)
                return out

            return step

        return {
            "fused": chained("fused"),
            "eager": lambda: add_rms_norm_reference(x, r, w, EPS),
            "compiled": chained("compiled"),
        }
    x = jax.device_put(jax.random.normal(keys[0], (tokens, 2 * width), dtype), device)  # [T, 2I]
    return {
        "fused": lambda: jitted["silu_fused"](x),
        "eager": lambda: silu_and_mul_reference(x),
        "compiled": lambda: jitted["silu_compiled"](x),
    }


def bench_jax(args: argparse.Namespace) -> None:
    import jax
    import jax.numpy as jnp

    from kernels.pallas import add_rms_norm, add_rms_norm_reference, silu_and_mul, silu_and_mul_reference

    dtype = jnp.dtype(args.dtype)
    device = next(d for d in jax.devices() if d.platform in ("gpu", "cuda", "rocm"))
    peak = _spec_peak(device.device_kind, args.peak_gbps)
    src = jax.device_put(jnp.zeros(128 * 2**20, jnp.uint16), device)  # 256 MiB
    invert = jax.jit(lambda a: ~a)  # a pure read+write pass: XLA's stand-in for a device-to-device copy
    copy_gbps = 2 * src.nbytes / _median_seconds_jax(lambda: invert(src), args.warmup, args.reps) / 1e9
    print(
        f"jax {jax.__version__} on {device.device_kind}: copy {copy_gbps:.0f} GB/s, spec peak {peak or 'unknown'} GB/s"
    )
    jitted = {
        "fused": jax.jit(lambda x, r, w: add_rms_norm(x, r, w, EPS), donate_argnums=1),
        "compiled": jax.jit(lambda x, r, w: add_rms_norm_reference(x, r, w, EPS), donate_argnums=1),
        "silu_fused": jax.jit(silu_and_mul),
        "silu_compiled": jax.jit(silu_and_mul_reference),
    }
    for kernel in args.kernels:
        for width in args.widths:
            for tokens in args.tokens:
                nbytes = _bytes_moved(kernel, tokens, width, dtype.itemsize)
                print(f"  jax {kernel} {args.dtype} [{tokens} x {width}]  ({nbytes / 1e6:.1f} MB moved)")
                cases = _jax_cases(kernel, tokens, width, dtype, device, jitted)
                seconds = {label: _median_seconds_jax(fn, args.warmup, args.reps) for label, fn in cases.items()}
                _report(seconds, nbytes, copy_gbps, peak)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=["torch", "jax", "both"], default="both")
    parser.add_argument("--kernels", type=lambda s: s.split(","), default=["add_rms_norm", "silu_and_mul"])
    parser.add_argument("--tokens", type=_ints, default=[1, 16, 256, 4096, 32768])
    parser.add_argument("--widths", type=_ints, default=[1024, 2048, 4096, 8192])
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--peak-gbps", type=float, default=None, help="spec memory bandwidth, if not in the table")
    args = parser.parse_args(argv)

    run_torch = args.framework in ("torch", "both") and _torch_gpu()
    run_jax = args.framework in ("jax", "both") and _jax_gpu()
    if not (run_torch or run_jax):
        searched = "torch or jax" if args.framework == "both" else args.framework
        print(
            f"benchmarks/kernels.py needs a GPU: none found for {searched}. Interpret-mode (CPU) timings would "
            "measure the interpreter, not the kernels; nothing measured."
        )
        return 0
    if run_torch:
        bench_torch(args)
    if run_jax:
        bench_jax(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
