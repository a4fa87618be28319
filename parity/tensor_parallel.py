"""Tensor-parallel logits in the parity check (`check --tp N`): sharded runs against unsharded ones.

Each backend runs the same ids on N devices (torch: N gloo processes, torch_impl/tp_launch.py; JAX: a mesh
over N devices, simulated on CPU, jax_impl/sharding.py), gathers the logits once (the explicit request for
whole logits), and is compared with its own unsharded logits and with the other backend's sharded logits.
Only logits are compared: sharding changes no other component's math, only where it is computed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np


def prepare_devices(tp: int) -> None:
    """On CPU JAX needs N simulated devices, which XLA reads once, when jax is first imported."""
    if tp > 1 and "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={tp}".strip()


def torch_tp_logits(directory: Path, ids: np.ndarray, tp: int, dtype: str) -> np.ndarray:
    from torch_impl.tp_launch import tp_logits

    return tp_logits(directory, ids, tp, dtype=dtype).float().numpy()  # [B, T, V], gathered on rank 0


def jax_tp_logits(directory: Path, ids: np.ndarray, tp: int, dtype: str) -> np.ndarray:
    import jax_impl
    from jax_impl import sharding

    mesh = sharding.make_mesh(tp)
    model = jax_impl.from_pretrained(directory, dtype, mesh=mesh)
    logits = sharding.sharded_logits(model, ids, mesh)  # stays vocabulary-sharded on the devices
    return sharding.gather_logits(logits, model.spec).astype(np.float32)
