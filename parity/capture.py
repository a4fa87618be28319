"""Run one backend on a checkpoint and token ids, and keep its trace as float32 numpy arrays.

One model at a time: a capture loads the model, runs one traced forward, converts the trace and drops the
model before the next capture starts, so a check holds one model (plus the small traces) at a time rather
than four. The torch trace is converted as the forward records it (layer by layer); JAX returns its trace
from one compiled program, converted and released array by array.

Backends are reached through their packages' attributes (`torch_impl.from_pretrained`, ...) at call time,
so tests can substitute a loader without any hook in this file.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Capture:
    backend: str  # "torch" | "jax" | "hf"
    dtype: str
    kernels: str  # as resolved by the backend ("reference" | "fused"); "-" for hf
    trace: dict[str, np.ndarray] = field(repr=False)
    load_s: float = 0.0
    run_s: float = 0.0


def prepare_kernels(kernels: str) -> None:
    """Make `kernels="fused"` runnable on a machine without a GPU: interpret Triton on the CPU.

    Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when kernels.triton.rms_norm is first
    imported, so this must run before that import (the CLI calls it before loading any model). An explicit
    TRITON_INTERPRET from the user wins. Pallas needs nothing: it picks interpret mode per call on CPU.
    """
    if kernels != "fused" or "TRITON_INTERPRET" in os.environ:
        return
    import torch  # importing torch does not import triton

    if torch.cuda.is_available():
        return
    if "kernels.triton.rms_norm" in sys.modules or "kernels.triton.swiglu" in sys.modules:
        return  # already decorated: the kernel's own launch check explains what to do
    os.environ["TRITON_INTERPRET"] = "1"


def release_memory() -> None:
    """Collect the dropped model and hand freed heap pages back to the OS.

    glibc keeps freed heap memory (a model's many mid-sized tensors) in its arenas: without the trim a
    0.6B model left up to ~1.2 GB resident after it was deleted, under the next capture's model (measured
    on a Qwen3-0.6B-shaped checkpoint: 1.45 -> 0.25 GB anonymous memory after a dropped bf16 model).
    A no-op where libc has no malloc_trim (macOS, musl).
    """
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


class _Float32Trace(dict):
    """A trace dict that stores each recorded torch tensor as a float32 numpy copy at once.

    The forward's activations are then freed as it goes, instead of every intermediate of every layer
    staying alive (in the activation dtype, on the device) until the forward returns.
    """

    def __setitem__(self, name: str, value) -> None:
        super().__setitem__(name, value.detach().float().cpu().numpy())


def capture_torch(
    checkpoint: str | Path, ids: np.ndarray, *, dtype: str, kernels: str = "reference", progress: bool = False
) -> Capture:
    import torch

    import torch_impl

    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    model = torch_impl.from_pretrained(checkpoint, dtype, kernels=kernels, device=device, progress=progress)
    loaded = time.perf_counter()
    trace = _Float32Trace()
    with torch.inference_mode():
        model(ids, trace=trace)
    run = time.perf_counter() - loaded
    resolved = model.kernels
    del model
    release_memory()
    return Capture("torch", dtype, resolved, dict(trace), loaded - start, run)


def capture_jax(
    checkpoint: str | Path, ids: np.ndarray, *, dtype: str, kernels: str = "reference", progress: bool = False
) -> Capture:
    import jax_impl

    start = time.perf_counter()
    model = jax_impl.from_pretrained(checkpoint, dtype, kernels=kernels, progress=progress)
    loaded = time.perf_counter()
    raw: dict = {}
    model(ids, trace=raw)  # one compiled program; compile time is part of run_s
    trace = {}
    for name in list(raw):
        trace[name] = np.asarray(raw.pop(name)).astype(np.float32)  # via ml_dtypes for bfloat16
    run = time.perf_counter() - loaded
    resolved = model.kernels
    del model, raw
    release_memory()
    return Capture("jax", dtype, resolved, trace, loaded - start, run)


def capture(
    backend: str,
    checkpoint: str | Path,
    ids: np.ndarray,
    *,
    dtype: str,
    kernels: str = "reference",
    progress: bool = False,
) -> Capture:
    """Load `backend` ("torch", "jax" or "hf") at `dtype` and capture its trace of `ids`."""
    if backend == "torch":
        return capture_torch(checkpoint, ids, dtype=dtype, kernels=kernels, progress=progress)
    if backend == "jax":
        return capture_jax(checkpoint, ids, dtype=dtype, kernels=kernels, progress=progress)
    if backend == "hf":
        from parity.hf_reference import capture_hf

        return capture_hf(checkpoint, ids, dtype=dtype, progress=progress)
    raise ValueError(f"unknown backend {backend!r}")
