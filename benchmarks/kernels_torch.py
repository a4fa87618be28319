"""benchmarks/kernels.py's torch sweep: the Triton kernels (kernels.triton) against the reference torch ops run
eagerly and through torch.compile, on one CUDA device.

Mirrors benchmarks/kernels_jax.py (the Pallas kernels): the same ops, shapes, variants and record per shape.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from typing import Any

from benchmarks.kernel_figures import EPS, GATED, RMS_NORM_OPTIONS, spec_peak, sweep
from benchmarks.kernel_timing import median_seconds_cuda


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
    peak = spec_peak(name, args.peak_gbps)
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
    dst = torch.empty_like(src)
    copy_seconds = median_seconds_cuda(lambda: dst.copy_(src), args.warmup, args.samples, args.calls)
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
    cases_of = functools.partial(_torch_cases, dtype=dtype, compiled=compiled)
    with torch.inference_mode():
        sweep(
            "torch", args, out, dtype.itemsize, cases_of, median_seconds_cuda, copy_gbps, peak, torch.cuda.empty_cache
        )
