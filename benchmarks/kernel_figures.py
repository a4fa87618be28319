"""What benchmarks/kernels.py measures and what it makes of the times: the ops and their options, the bytes
each must move, a record of one shape's figures (seconds, GB/s, fractions of the copy and of the spec peak), the
sweep over the shapes that both frameworks' benchmarks run with their own cases and timer (`sweep`), the fused
kernels' floors, and the JSON they are written to.

Plain arithmetic over the figures, with no framework import: benchmarks/gpu_report.py (gpu_check.sh's report)
reads the same records and floors. The ops mirror kernels/*/rms_norm.py and kernels/*/swiglu.py, named as
kernels.triton and kernels.pallas export them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

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
VARIANTS = ("fused", "plain", "compiled")
# The ops measured: add_rms_norm with each family's options (kernels/*/rms_norm.py), and the gated activations
# (kernels/*/swiglu.py), each named as kernels.triton / kernels.pallas export it.
RMS_NORM_OPTIONS = {
    "add_rms_norm": {},  # Qwen, Llama
    "add_rms_norm_gemma": {"offset": 1.0, "float32_weight": True},  # Gemma 2/3 (OLMo 2: offset 0, same work)
}
GATED = ("silu_and_mul", "gelu_tanh_and_mul")
KERNELS = (*RMS_NORM_OPTIONS, *GATED)
# What runs without --kernels: the two ops every model uses, whose floors benchmarks/gpu_check.sh checks within its
# time budget; the family variants (same memory traffic, a few more flops) on request.
DEFAULT_KERNELS = ("add_rms_norm", "silu_and_mul")
# The fused kernels' floors, and the shape they apply to: large enough that the op is bandwidth-bound.
FLOOR_DTYPE, FLOOR_WIDTH, FLOOR_MIN_TOKENS = "bfloat16", 4096, 4096
FLOOR_OF_COPY = 0.85  # fused bandwidth / device-to-device copy bandwidth
FLOOR_VS_PLAIN = 1.3  # fused speed / the plain framework ops'


def spec_peak(device_name: str, override: float | None) -> float | None:
    if override is not None:
        return override
    return next((gbps for key, gbps in SPEC_PEAK_GBPS.items() if key in device_name), None)


def bytes_moved(kernel: str, tokens: int, width: int, itemsize: int) -> int:
    if kernel in RMS_NORM_OPTIONS:  # read x, residual, weight; write out, new residual
        return (4 * tokens * width + width) * itemsize
    return 3 * tokens * width * itemsize  # gated: read [T, 2I], write [T, I]; width is I


def record_of(seconds: dict[str, float], nbytes: int, copy_gbps: float, peak: float | None) -> dict[str, Any]:
    """Per variant: seconds per call, GB/s, and the fractions of copy and peak; then the fused kernel's speedups."""
    variants = {}
    for label, t in seconds.items():
        gbps = nbytes / t / 1e9
        variants[label] = {
            "seconds": t,
            "gbps": gbps,
            "of_copy": gbps / copy_gbps,
            "of_peak": gbps / peak if peak else None,
        }
    fused = seconds["fused"]
    return {
        "bytes": nbytes,
        "variants": variants,
        "fused_vs_plain": seconds["plain"] / fused,
        "fused_vs_compiled": seconds["compiled"] / fused,
    }


def print_record(record: dict[str, Any]) -> None:
    for label, v in record["variants"].items():
        peak_txt = f"{v['of_peak']:6.1%}" if v["of_peak"] is not None else "   n/a"
        print(
            f"    {label:<9} {v['seconds'] * 1e6:10.1f} us {v['gbps']:8.1f} GB/s {v['of_copy']:7.1%} of copy "
            f"{peak_txt} of peak"
        )
    print(f"    fused is {record['fused_vs_plain']:.2f}x the plain ops, {record['fused_vs_compiled']:.2f}x compiled")


def evaluate_floors(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The floors, one entry per (measured floor-shaped case, floor): its value, bound and verdict."""
    floors = []
    for r in results:
        if (r["dtype"], r["width"]) != (FLOOR_DTYPE, FLOOR_WIDTH) or r["tokens"] < FLOOR_MIN_TOKENS:
            continue
        case = {key: r[key] for key in ("framework", "kernel", "dtype", "tokens", "width")}
        for floor, value, bound in (
            ("fused bandwidth / copy bandwidth", r["variants"]["fused"]["of_copy"], FLOOR_OF_COPY),
            ("fused speed / the plain framework ops'", r["fused_vs_plain"], FLOOR_VS_PLAIN),
        ):
            floors.append(case | {"floor": floor, "value": value, "bound": bound, "passed": value >= bound})
    return floors


def print_floors(floors: list[dict[str, Any]]) -> None:
    where = f"{FLOOR_DTYPE}, width {FLOOR_WIDTH}, >= {FLOOR_MIN_TOKENS} tokens"
    if not floors:
        print(f"floors: not evaluated, the sweep has no {where} shape")
        return
    print(f"floors ({where}): fused >= {FLOOR_OF_COPY:.0%} of copy, >= {FLOOR_VS_PLAIN}x the plain ops")
    for f in floors:
        value = f"{f['value']:.1%}" if f["bound"] < 1 else f"{f['value']:.2f}x"
        bound = f"{f['bound']:.0%}" if f["bound"] < 1 else f"{f['bound']}x"
        print(
            f"  {f['framework']:<5} {f['kernel']:<12} [{f['tokens']} x {f['width']}]  {f['floor']}: {value} "
            f"(>= {bound})  {'ok' if f['passed'] else 'BELOW THE FLOOR'}"
        )


def sweep(
    framework: str,
    args: argparse.Namespace,
    out: dict[str, Any],
    itemsize: int,
    cases_of: Callable[[str, int, int], dict[str, Callable[[], object]]],
    median: Callable[[Callable[[], object], int, int, int], float],
    copy_gbps: float,
    peak: float | None,
    after_shape: Callable[[], object] | None = None,
) -> None:
    """Every (kernel, width, tokens) of the sweep in `args`: `cases_of(kernel, tokens, width)` gives the shape's
    variants ("fused", "plain", "compiled"), `median(fn, warmup, samples, calls)` times each; the record is
    printed, appended to out["results"] and saved at once (a run stopped later keeps it). The shape's cases are
    dropped before the next shape allocates its own, then `after_shape` runs (torch: return the cached memory)."""
    for kernel in args.kernels:
        for width in args.widths:
            for tokens in args.tokens:
                nbytes = bytes_moved(kernel, tokens, width, itemsize)
                print(f"  {framework} {kernel} {args.dtype} [{tokens} x {width}]  ({nbytes / 1e6:.1f} MB moved)")
                cases = cases_of(kernel, tokens, width)
                seconds = {label: median(fn, args.warmup, args.samples, args.calls) for label, fn in cases.items()}
                record = record_of(seconds, nbytes, copy_gbps, peak)
                print_record(record)
                case = {"framework": framework, "kernel": kernel, "dtype": args.dtype, "tokens": tokens, "width": width}
                out["results"].append(case | record)
                save(args, out)
                del cases  # free this shape's buffers before the next one allocates
                if after_shape is not None:
                    after_shape()


def save(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Write the figures so far to --json (after every shape too: a run killed later still leaves them)."""
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
