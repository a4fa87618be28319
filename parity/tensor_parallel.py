"""Tensor-parallel runs in the parity check (`check --tp N`): sharded results against unsharded ones.

Each backend runs the same ids on N devices (torch: N gloo processes, torch_impl/tp_launch.py; JAX: a mesh
over N devices, simulated on CPU, jax_impl/tensor_parallel.py), gathers the logits once (`gather_logits`,
the explicit request for whole logits), and is compared with its own unsharded logits and with the other
backend's sharded logits; with --grad, the loss (from vocabulary-sharded logits, never gathered) and every
gradient likewise, and with --steps the parameters after N AdamW steps (parity/gradients.py's run_steps with
tp > 1). Sharding changes no other component's math, only where it is computed. `ep` > 1 (mixture of experts)
also shards the experts over ep ranks (torch: tp * ep processes; JAX: the mesh's "expert" axis). Call
parity.prepare_environment(tp=N * ep) first (parity.check does).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _ep(ep: int) -> dict:
    """The expert-parallel keyword, only when sharding experts: a dense run calls the launchers exactly as before."""
    return {"ep": ep} if ep > 1 else {}


def torch_tp_logits(directory: Path, ids: np.ndarray, tp: int, dtype: str, ep: int = 1) -> np.ndarray:
    from torch_impl.tp_launch import launch_logits

    return launch_logits(directory, ids, tp, dtype=dtype, **_ep(ep)).float().numpy()  # [B, T, V], on rank 0


def jax_tp_logits(directory: Path, ids: np.ndarray, tp: int, dtype: str, ep: int = 1) -> np.ndarray:
    import jax_impl
    from jax_impl import tensor_parallel
    from jax_impl.vocab_parallel import gather_logits

    mesh = tensor_parallel.make_mesh(tp, **_ep(ep))
    model = jax_impl.from_pretrained(directory, dtype, mesh=mesh)
    logits = tensor_parallel.sharded_logits(model, ids, mesh)  # stays vocabulary-sharded on the devices
    return np.asarray(gather_logits(logits, model.spec.vocab_size)).astype(np.float32)


def torch_tp_grads(directory: Path, ids: np.ndarray, tp: int, dtype: str) -> tuple[float, dict[str, np.ndarray]]:
    from torch_impl.tp_launch import launch_grads

    return launch_grads(directory, ids, tp, dtype=dtype)  # rank 0's, put together from every rank's slices


def jax_tp_grads(directory: Path, ids: np.ndarray, tp: int, dtype: str) -> tuple[float, dict[str, np.ndarray]]:
    import jax_impl
    from jax_impl import tensor_parallel
    from jax_impl.training import loss_and_grads

    model = jax_impl.from_pretrained(directory, dtype, mesh=tensor_parallel.make_mesh(tp))
    return loss_and_grads(model, ids)
