"""Kernel tests run the fused kernels on CPU in interpret mode when there is no GPU.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when kernels.triton.add_rms_norm is first
imported, so it must be set before any test module imports it; collection imports this file first.
setdefault: an explicit TRITON_INTERPRET=0/1 from the user wins. Pallas needs nothing: it decides per call.
"""

from __future__ import annotations

import os


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
