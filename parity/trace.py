"""What a capture returns, and the memory hygiene between captures: shared by parity/capture.py (torch, JAX)
and parity/hf_reference.py (transformers), so neither imports the other's module for it.
"""

from __future__ import annotations

import ctypes
import gc
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Capture:
    backend: str  # "torch" | "jax" | "hf"
    dtype: str
    kernels: str  # as resolved by the backend ("reference" | "fused"); "-" for hf
    trace: dict[str, np.ndarray] = field(repr=False)
    load_s: float = 0.0
    run_s: float = 0.0


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
