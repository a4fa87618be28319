"""Where benchmarks/kernels.py can measure, and how it times a call: GPU detection for torch and JAX, and the
timing loops, one per framework (CUDA-graph replays timed by CUDA events for torch, dispatched calls and one wait
for JAX).

Both return the median seconds per call of the samples; every variant of a shape, the copy baseline included,
is timed by the same loop, so the fractions benchmarks/kernel_figures.py computes compare like with like.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable


def torch_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def jax_gpu() -> bool:
    try:
        import jax
    except ImportError:
        return False
    return any(d.platform in ("gpu", "cuda", "rocm") for d in jax.devices())


def median_seconds_cuda(fn: Callable[[], object], warmup: int, samples: int, calls: int) -> float:
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


def median_seconds_jax(fn: Callable[[], object], warmup: int, samples: int, calls: int) -> float:
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
