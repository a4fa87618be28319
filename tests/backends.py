"""Helpers every test shares: reach either backend by name, and turn any tensor into float32 numpy.

Loading a checkpoint and running one forward (both backends, and transformers) is parity.capture's job; the
tests use it wherever a trace or the logits are all they need. `load` is here only for tests that need the
model object itself (generation, keyword arguments of the forward, attributes of the loaded model).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

BACKENDS = ("torch", "jax")


def package(backend: str) -> ModuleType:
    """The backend's package (torch_impl or jax_impl): both expose from_pretrained and generate alike."""
    return importlib.import_module(f"{backend}_impl")


def load(backend: str, directory: Path, dtype: str = "float32", kernels: str = "reference") -> Any:
    return package(backend).from_pretrained(directory, dtype, kernels=kernels)


def to_numpy(x: Any) -> np.ndarray:
    """A float32 numpy copy of a torch tensor, a jax array or a numpy array (any float dtype).

    JAX arrays are cast in numpy (ml_dtypes for bfloat16), not by `x.astype`: an eager JAX cast costs an
    XLA compile per new shape. Every cast here is exact (float32 holds every bf16/fp16 value).
    """
    if hasattr(x, "detach"):  # torch
        return x.detach().float().cpu().numpy()
    return np.asarray(x).astype(np.float32)


def run(model: Any, ids: Any, **kwargs: Any) -> np.ndarray:
    """The model's forward on `ids` as float32 numpy (torch under inference_mode)."""
    if hasattr(model, "parameters"):  # torch
        import torch

        with torch.inference_mode():
            return to_numpy(model(ids, **kwargs))
    return to_numpy(model(ids, **kwargs))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| relative to the largest magnitude of the reference b."""
    return float(np.abs(a - b).max() / np.abs(b).max())


def rms_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The root-mean-square of a - b: how far a low-precision run's logits lie from the float32 ones. The fused path's
    bf16 logits are held to the reference path's distance times a factor, and the distance is the RMS, not the max:
    two correct bf16 implementations (torch_impl and jax_impl on the default checkpoint, 96 positions x 263 logits)
    lie 0.0749 and 0.0618 from the float32 logits at most (x1.21) but 0.01246 and 0.01244 in RMS (x1.002). A compiled
    kernel (a GPU's approximate rsqrt and exp) flips a few bf16 roundings that the reference makes the other way,
    which redraws the max and leaves the RMS; a real error (a wrong row, a lost term) moves both."""
    return float(np.sqrt(np.mean(np.square(np.asarray(a, np.float64) - np.asarray(b, np.float64)))))


def both_outcomes(call: Callable[[str], Any]) -> tuple[str, Any, Any]:
    """`call(backend)` for both backends: ("refused", torch's message, jax's) where both raised an InputError with
    the same message, else ("ran", torch's result, jax's). One backend refusing alone, two messages, or any other
    exception fails the calling test: the twins must treat every input alike."""
    from spec import InputError

    got = {}
    for backend in BACKENDS:
        try:
            got[backend] = ("ran", call(backend))
        except InputError as e:
            got[backend] = ("refused", str(e))
    (kind, torch_value), (jax_kind, jax_value) = got["torch"], got["jax"]
    assert kind == jax_kind, got
    assert kind == "ran" or torch_value == jax_value, got
    return kind, torch_value, jax_value
