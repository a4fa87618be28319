"""Operands for the CPU kernels' torch tests (test_cpu_decode_ops.py, test_cpu_attend.py): seeded random tensors of a
dtype, the dtype's name in the tolerance table, and a tensor as float32 numpy for the comparisons."""

from __future__ import annotations

import numpy as np
import torch

DTYPES = [torch.float32, torch.bfloat16]


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def numpy(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy()
