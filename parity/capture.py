"""Run one backend on a checkpoint and token ids, and keep its trace as float32 numpy arrays.

One model at a time: a capture loads the model, runs one traced forward, converts the trace and drops the
model before the next capture starts, so a check holds one model (plus the small traces) at a time rather
than four. The torch trace is converted as the forward records it (layer by layer); JAX returns its trace
from one compiled program, converted and released array by array.

`routing` (teacher-forced routing, issue 18): sparse layer -> expert ids [B, T, k] each backend uses instead of
its own choice (the backends' `routing=` keyword; transformers' through a router hook).

Backends are reached through their packages' attributes (`torch_impl.from_pretrained`, ...) at call time,
so tests can substitute a loader without any hook in this file.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from parity.hf_reference import capture_hf
from parity.trace import Capture, release_memory


class _Float32Trace(dict):
    """A trace dict that stores each recorded torch tensor as a float32 numpy copy at once.

    The forward's activations are then freed as it goes, instead of every intermediate of every layer
    staying alive (in the activation dtype, on the device) until the forward returns.
    """

    def __setitem__(self, name: str, value) -> None:
        super().__setitem__(name, value.detach().float().cpu().numpy())


Routing = dict[int, np.ndarray] | None


def capture_torch(
    checkpoint: str | Path,
    ids: np.ndarray,
    *,
    dtype: str,
    kernels: str = "reference",
    progress: bool = False,
    routing: Routing = None,
) -> Capture:
    import torch

    import torch_impl

    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    model = torch_impl.from_pretrained(checkpoint, dtype, kernels=kernels, device=device, progress=progress)
    loaded = time.perf_counter()
    trace = _Float32Trace()
    with torch.inference_mode():
        model(ids, trace=trace, **_routing(routing))
    run = time.perf_counter() - loaded
    resolved = model.kernels
    del model
    release_memory()
    return Capture("torch", dtype, resolved, dict(trace), loaded - start, run)


def capture_jax(
    checkpoint: str | Path,
    ids: np.ndarray,
    *,
    dtype: str,
    kernels: str = "reference",
    progress: bool = False,
    routing: Routing = None,
) -> Capture:
    import jax_impl

    start = time.perf_counter()
    model = jax_impl.from_pretrained(checkpoint, dtype, kernels=kernels, progress=progress)
    loaded = time.perf_counter()
    raw: dict = {}
    model(ids, trace=raw, **_routing(routing))  # one compiled program; compile time is part of run_s
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
    routing: Routing = None,
) -> Capture:
    """Load `backend` ("torch", "jax" or "hf") at `dtype` and capture its trace of `ids` (`routing`: forced)."""
    if backend == "torch":
        return capture_torch(checkpoint, ids, dtype=dtype, kernels=kernels, progress=progress, routing=routing)
    if backend == "jax":
        return capture_jax(checkpoint, ids, dtype=dtype, kernels=kernels, progress=progress, routing=routing)
    if backend == "hf":
        return capture_hf(checkpoint, ids, dtype=dtype, progress=progress, routing=routing)
    raise ValueError(f"unknown backend {backend!r}")


def _routing(routing: Routing) -> dict:
    """The forward's routing keyword, only when given: a dense model's forward is called exactly as before."""
    return {} if routing is None else {"routing": {i: np.asarray(v, dtype=np.int32) for i, v in routing.items()}}


def teacher_routing(trace: dict[str, np.ndarray], sparse_layers: tuple[int, ...]) -> dict[int, np.ndarray]:
    """A run's own expert choices, per sparse layer, as the ids to force on another run ([B, T, k] int32)."""
    return {i: trace[f"layers.{i}.moe.topk_ids"].astype(np.int32) for i in sparse_layers}
