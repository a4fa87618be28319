"""Tensor-parallel runs in the parity check (`check --tp N`): sharded results against unsharded ones.

Each backend runs the same ids on N devices (torch: N gloo processes, torch_impl/tp_launch.py; JAX: a mesh
over N devices, simulated on CPU, jax_impl/tensor_parallel.py), gathers the logits once (`gather_logits`,
the explicit request for whole logits), and is compared with its own unsharded logits and with the other
backend's sharded logits; with --grad, the loss (from vocabulary-sharded logits, never gathered) and every
gradient likewise, and with --steps the parameters after N AdamW steps. Sharding changes no other component's
math, only where it is computed. `ep` > 1 (mixture of experts) also shards the experts over ep ranks (torch:
tp * ep processes; JAX: the mesh's "expert" axis). Call parity.prepare_environment(tp=N * ep) first
(parity.check does).
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


def torch_tp_steps(
    directory: Path, batches: list[np.ndarray], config, tp: int, dtype: str
) -> tuple[list[float], None, dict[str, np.ndarray]]:
    """(losses, -, parameters after) of AdamW steps on `tp` gloo processes, as parity/gradients.py's run_steps."""
    from torch_impl.tp_launch import launch_steps

    losses, after = launch_steps(directory, batches, config, tp, dtype=dtype)
    return losses, None, after


def jax_tp_steps(
    directory: Path, batches: list[np.ndarray], config, tp: int, dtype: str
) -> tuple[list[float], None, dict[str, np.ndarray]]:
    """(losses, -, parameters after) of AdamW steps on a `tp`-device mesh."""
    import jax_impl
    from jax_impl import tensor_parallel, training

    model = jax_impl.from_pretrained(directory, dtype, mesh=tensor_parallel.make_mesh(tp))
    optimizer = training.make_optimizer(model, config)
    losses = [training.train_step(model, optimizer, config, ids) for ids in batches]
    return losses, None, training.parameters(model)
