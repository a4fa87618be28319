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

Without a GPU it says so and exits 0 (2 with --require-gpu): interpret-mode (CPU) timings would measure the
interpreter, not the kernels.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
NO_GPU = (
    "benchmarks/kernels.py needs a GPU: none found for {searched}. Interpret-mode (CPU) timings would measure "
    "the interpreter, not the kernels; nothing measured."
)


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
    if kernel in RMS_NORM_OPTIONS:  # read x, residual, weight; write out, new residual
        return (4 * tokens * width + width) * itemsize
    return 3 * tokens * width * itemsize  # gated: read [T, 2I], write [T, I]; width is I


def _record(seconds: dict[str, float], nbytes: int, copy_gbps: float, peak: float | None) -> dict[str, Any]:
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


def _print_record(record: dict[str, Any]) -> None:
    for label, v in record["variants"].items():
        peak_txt = f"{v['of_peak']:6.1%}" if v["of_peak"] is not None else "   n/a"
        print(
            f"    {label:<9} {v['seconds'] * 1e6:10.1f} us {v['gbps']:8.1f} GB/s {v['of_copy']:7.1%} of copy "
            f"{peak_txt} of peak"
        )
    print(f"    fused is {record['fused_vs_plain']:.2f}x the plain ops, {record['fused_vs_compiled']:.2f}x compiled")


def _median_seconds_cuda(fn: Callable[[], object], warmup: int, samples: int, calls: int) -> float:
    """Median seconds per call. Each sample replays a CUDA graph of `calls` back-to-back calls between two CUDA
    events, so the GPU time is measured, not the host's: a Triton launch costs the host tens of microseconds,
    about what a bf16 [4096, 4096] norm costs the GPU, and launched one by one the host would set the pace. Every
    variant, the copy baseline included, is timed the same way. Where a call cannot be captured in a graph, the
    calls are launched one by one instead (the host's latency then counts where it cannot keep up)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    run = functools.partial(_launch_calls, fn, calls)
    try:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # one call on the capture stream first, as CUDA graph capture asks
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            _launch_calls(fn, calls)
        run = graph.replay
    except RuntimeError as err:  # not capturable: eager launches (the docstring)
        print(f"    (not captured in a CUDA graph, timed as launched: {str(err).splitlines()[0][:120]})")
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(samples):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)  # ms -> s
    return statistics.median(times)


def _launch_calls(fn: Callable[[], object], calls: int) -> None:
    for _ in range(calls):
        fn()


def _median_seconds_jax(fn: Callable[[], object], warmup: int, samples: int, calls: int) -> float:
    """Median seconds per call. Each sample dispatches `calls` calls and waits for the last (JAX dispatches
    asynchronously and one device stream runs them in order): dispatch overlaps the previous call's run."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn()
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def _torch_cases(kernel: str, tokens: int, width: int, dtype, compiled: dict) -> dict[str, Callable[[], object]]:
    import torch

    import kernels.triton as ops

    if kernel in RMS_NORM_OPTIONS:
        options = RMS_NORM_OPTIONS[kernel]
        x, r = (torch.randn(tokens, width, device="cuda", dtype=dtype) for _ in range(2))  # [T, H] each
        w = torch.randn(width, device="cuda", dtype=dtype)
        return {
            "fused": lambda: ops.add_rms_norm(x, r, w, EPS, **options),
            "plain": lambda: ops.add_rms_norm_reference(x, r, w, EPS, **options),
            "compiled": lambda: compiled[kernel](x, r, w, EPS),
        }
    x = torch.randn(tokens, 2 * width, device="cuda", dtype=dtype)  # [T, 2I]
    fused, reference = getattr(ops, kernel), getattr(ops, f"{kernel}_reference")
    return {"fused": lambda: fused(x), "plain": lambda: reference(x), "compiled": lambda: compiled[kernel](x)}


def bench_torch(args: argparse.Namespace, out: dict[str, Any]) -> None:
    import torch

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        reason = "TRITON_INTERPRET is set: the Triton kernels would run in the CPU interpreter"
        print(f"torch: skipped, {reason}")
        out["skipped"]["torch"] = reason
        return

    import triton

    import kernels.triton as ops

    dtype = getattr(torch, args.dtype)
    name = torch.cuda.get_device_name()
    peak = _spec_peak(name, args.peak_gbps)
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
    dst = torch.empty_like(src)
    copy_seconds = _median_seconds_cuda(lambda: dst.copy_(src), args.warmup, args.samples, args.calls)
    copy_gbps = 2 * src.numel() / copy_seconds / 1e9
    print(f"torch {torch.__version__} on {name}: copy {copy_gbps:.0f} GB/s, spec peak {peak or 'unknown'} GB/s")
    out["devices"]["torch"] = name
    out["versions"].update(torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda)
    out["copy_gbps"]["torch"] = copy_gbps
    out["spec_peak_gbps"]["torch"] = peak
    # One compiled graph per shape: raise dynamo's recompile limit (renamed across torch versions) above the sweep.
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 64))
    compiled = {
        **{k: torch.compile(functools.partial(ops.add_rms_norm_reference, **o)) for k, o in RMS_NORM_OPTIONS.items()},
        **{k: torch.compile(getattr(ops, f"{k}_reference")) for k in GATED},
    }
    with torch.inference_mode():
        for kernel in args.kernels:
            for width in args.widths:
                for tokens in args.tokens:
                    nbytes = _bytes_moved(kernel, tokens, width, dtype.itemsize)
                    print(f"  torch {kernel} {args.dtype} [{tokens} x {width}]  ({nbytes / 1e6:.1f} MB moved)")
                    cases = _torch_cases(kernel, tokens, width, dtype, compiled)
                    seconds = {
                        label: _median_seconds_cuda(fn, args.warmup, args.samples, args.calls)
                        for label, fn in cases.items()
                    }
                    record = _record(seconds, nbytes, copy_gbps, peak)
                    _print_record(record)
                    out["results"].append(
                        {"framework": "torch", "kernel": kernel, "dtype": args.dtype, "tokens": tokens, "width": width}
                        | record
                    )
                    save(args, out)
                    del cases  # free this shape's buffers before the next one allocates
                    torch.cuda.empty_cache()


def _jax_cases(kernel: str, tokens: int, width: int, dtype, device, jitted: dict) -> dict[str, Callable[[], object]]:
    import jax
    import jax.numpy as jnp

    import kernels.pallas as ops

    keys = jax.random.split(jax.random.key(0))
    if kernel in RMS_NORM_OPTIONS:
        options = RMS_NORM_OPTIONS[kernel]
        x, r = (jax.device_put(jax.random.normal(k, (tokens, width), dtype), device) for k in keys)  # [T, H] each
        w = jax.device_put(jnp.ones(width, dtype), device)
        state = {"fused": jnp.copy(r), "compiled": jnp.copy(r)}  # donated buffers, apart from r

        def chained(label: str) -> Callable[[], object]:
            # The residual is donated and fed back, as a decoder would, so that input_output_aliases can
            # update it in place; without donation XLA must copy it first.
            def step() -> object:
                out, state[label] = jitted[kernel, label](x, state[label], w)
                return out

            return step

        return {
            "fused": chained("fused"),
            "plain": lambda: ops.add_rms_norm_reference(x, r, w, EPS, **options),
            "compiled": chained("compiled"),
        }
    x = jax.device_put(jax.random.normal(keys[0], (tokens, 2 * width), dtype), device)  # [T, 2I]
    reference = getattr(ops, f"{kernel}_reference")
    return {
        "fused": lambda: jitted[kernel, "fused"](x),
        "plain": lambda: reference(x),
        "compiled": lambda: jitted[kernel, "compiled"](x),
    }


def bench_jax(args: argparse.Namespace, out: dict[str, Any]) -> None:
    import jax
    import jax.numpy as jnp

    import kernels.pallas as ops

    dtype = jnp.dtype(args.dtype)
    device = next(d for d in jax.devices() if d.platform in ("gpu", "cuda", "rocm"))
    peak = _spec_peak(device.device_kind, args.peak_gbps)
    src = jax.device_put(jnp.zeros(128 * 2**20, jnp.uint16), device)  # 256 MiB
    invert = jax.jit(lambda a: ~a)  # a pure read+write pass: XLA's stand-in for a device-to-device copy
    copy_gbps = 2 * src.nbytes / _median_seconds_jax(lambda: invert(src), args.warmup, args.samples, args.calls) / 1e9
    print(
        f"jax {jax.__version__} on {device.device_kind}: copy {copy_gbps:.0f} GB/s, spec peak {peak or 'unknown'} GB/s"
    )
    out["devices"]["jax"] = device.device_kind
    out["versions"]["jax"] = jax.__version__
    out["copy_gbps"]["jax"] = copy_gbps
    out["spec_peak_gbps"]["jax"] = peak
    jitted = {}  # (kernel, "fused" | "compiled") -> the jitted function
    for kernel, options in RMS_NORM_OPTIONS.items():
        for label, fn in (("fused", ops.add_rms_norm), ("compiled", ops.add_rms_norm_reference)):
            bound = functools.partial(fn, eps=EPS, **options)
            jitted[kernel, label] = jax.jit(lambda x, r, w, bound=bound: bound(x, r, w), donate_argnums=1)
    for kernel in GATED:
        jitted[kernel, "fused"] = jax.jit(getattr(ops, kernel))
        jitted[kernel, "compiled"] = jax.jit(getattr(ops, f"{kernel}_reference"))
    for kernel in args.kernels:
        for width in args.widths:
            for tokens in args.tokens:
                nbytes = _bytes_moved(kernel, tokens, width, dtype.itemsize)
                print(f"  jax {kernel} {args.dtype} [{tokens} x {width}]  ({nbytes / 1e6:.1f} MB moved)")
                cases = _jax_cases(kernel, tokens, width, dtype, device, jitted)
                seconds = {
                    label: _median_seconds_jax(fn, args.warmup, args.samples, args.calls) for label, fn in cases.items()
                }
                record = _record(seconds, nbytes, copy_gbps, peak)
                _print_record(record)
                out["results"].append(
                    {"framework": "jax", "kernel": kernel, "dtype": args.dtype, "tokens": tokens, "width": width}
                    | record
                )
                save(args, out)


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


# ---- the report of benchmarks/gpu_check.sh ---------------------------------------------------------------------
TIMED_OUT = (124, 137)  # `timeout`'s exit status, and a KILL's after --kill-after


def junit_summary(path: Path) -> dict[str, Any]:
    """Counts, failures and skips of a pytest --junitxml file."""
    import xml.etree.ElementTree as ET

    cases = list(ET.parse(path).getroot().iter("testcase"))
    summary: dict[str, Any] = {"total": len(cases), "passed": 0, "failed": [], "skipped": [], "seconds": 0.0}
    for case in cases:
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        summary["seconds"] += float(case.get("time", 0) or 0)
        failure = next((e for e in case if e.tag in ("failure", "error")), None)
        skipped = case.find("skipped")
        if failure is not None:
            summary["failed"].append({"test": name, "message": (failure.get("message") or "")[:1000]})
        elif skipped is not None:
            summary["skipped"].append({"test": name, "reason": (skipped.get("message") or "")[:300]})
        else:
            summary["passed"] += 1
    return summary


def check_report(
    tests_xml: Path | None,
    tests_status: int,
    kernels_json: Path | None,
    kernels_status: int,
    gpus: dict[str, Any],
    seconds: float,
    budget_seconds: float,
) -> dict[str, Any]:
    """gpu_check.sh's one JSON: the GPU tests' outcome, every kernel figure, the floors, and what failed.

    It passes only when the tests ran and all passed (a skipped `gpu` test is a check that did not run), the
    benchmark ran, and every floor was evaluated and holds. Exit status 124 (137 after a KILL) is `timeout`'s:
    a step ran past its share of the time budget.
    """
    problems = []
    tests = junit_summary(tests_xml) if tests_xml is not None and tests_xml.is_file() else None
    if tests_status in TIMED_OUT:
        problems.append("the gpu tests ran past their time budget")
    if tests is None:
        problems.append(f"the gpu tests left no report (pytest exit status {tests_status})")
    else:
        if tests["total"] == 0:
            problems.append("no gpu test was collected")
        problems += [f"failed: {f['test']}" for f in tests["failed"]]
        problems += [f"skipped, so not checked: {s['test']} ({s['reason']})" for s in tests["skipped"]]
    kernels = json.loads(kernels_json.read_text()) if kernels_json is not None and kernels_json.is_file() else None
    if kernels_status in TIMED_OUT:
        problems.append("benchmarks/kernels.py ran past its time budget")
    if kernels is None:
        problems.append(f"benchmarks/kernels.py left no figures (exit status {kernels_status})")
    else:
        problems += [f"benchmark skipped {name}: {why}" for name, why in kernels.get("skipped", {}).items()]
        if not kernels.get("floors"):
            problems.append("the floors were not evaluated: no floor-shaped case was measured")
        problems += [
            f"below the floor: {f['framework']} {f['kernel']} [{f['tokens']} x {f['width']}] {f['floor']} "
            f"{f['value']:.3g} < {f['bound']}"
            for f in kernels.get("floors", [])
            if not f["passed"]
        ]
    figures = [
        {key: r[key] for key in ("framework", "kernel", "dtype", "tokens", "width")}
        | {f"{label}_of_copy": r["variants"][label]["of_copy"] for label in VARIANTS}
        | {"fused_vs_plain": r["fused_vs_plain"], "fused_vs_compiled": r["fused_vs_compiled"]}
        for r in (kernels or {}).get("results", [])
    ]
    return {
        "script": "benchmarks/gpu_check.sh",
        "passed": not problems,
        "problems": problems,
        "gpus": gpus,
        "seconds": seconds,
        "budget_seconds": budget_seconds,
        "tests": tests,
        "tests_exit_status": tests_status,
        "figures": figures,
        "floors": (kernels or {}).get("floors", []),
        "kernels": kernels,
        "kernels_exit_status": kernels_status,
    }


def report_main(argv: list[str]) -> int:
    """`python -c 'from benchmarks.kernels import report_main; ...' ARGS`: write gpu_check.sh's JSON, print it short."""
    parser = argparse.ArgumentParser(description="assemble benchmarks/gpu_check.sh's report")
    parser.add_argument("--tests-xml", type=Path, required=True)
    parser.add_argument("--tests-status", type=int, required=True)
    parser.add_argument("--kernels-json", type=Path, required=True)
    parser.add_argument("--kernels-status", type=int, required=True)
    parser.add_argument("--gpus", type=json.loads, default={})
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--budget-seconds", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    report = check_report(
        args.tests_xml, args.tests_status, args.kernels_json, args.kernels_status, args.gpus, args.seconds,
        args.budget_seconds,
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    tests = report["tests"]
    if tests is not None:
        print(
            f"gpu tests: {tests['passed']} passed, {len(tests['failed'])} failed, {len(tests['skipped'])} skipped "
            f"of {tests['total']}"
        )
    for f in report["figures"]:
        print(
            f"{f['framework']:<5} {f['kernel']:<12} [{f['tokens']} x {f['width']}] {f['dtype']}: of copy: fused "
            f"{f['fused_of_copy']:.1%}, plain ops {f['plain_of_copy']:.1%}, compiled {f['compiled_of_copy']:.1%}; "
            f"fused {f['fused_vs_plain']:.2f}x plain, {f['fused_vs_compiled']:.2f}x compiled"
        )
    print_floors(report["floors"])
    verdict = "PASS" if report["passed"] else "FAIL:\n  " + "\n  ".join(report["problems"])
    print(f"gpu_check {verdict}\n({report['seconds']:.0f} s of {report['budget_seconds']:.0f}; JSON: {args.out})")
    return 0 if report["passed"] else 1


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

    run_torch = args.framework in ("torch", "both") and _torch_gpu()
    run_jax = args.framework in ("jax", "both") and _jax_gpu()
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
    try:
        if run_torch:
            bench_torch(args, out)
        if run_jax:
            bench_jax(args, out)
    except KeyboardInterrupt:  # gpu_check.sh's time budget (SIGINT): the floors of what was measured, and the JSON
        print("interrupted: the floors below are evaluated on the shapes measured so far")
        out["skipped"]["interrupted"] = "stopped by SIGINT (gpu_check.sh's time budget) before every shape was measured"
    out["floors"] = evaluate_floors(out["results"])
    out["floors_passed"] = all(f["passed"] for f in out["floors"]) if out["floors"] else None
    print_floors(out["floors"])
    save(args, out)
    if args.json is not None:
        print(f"figures written to {args.json}")
    return 0


def save(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Write the figures so far to --json (after every shape too: a run killed later still leaves them)."""
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
