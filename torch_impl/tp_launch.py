"""Launching a tensor-parallel run: a local process group, rank 0's result back in the caller.

Companion of torch_impl/tensor_parallel.py and what a CLI calls (`decoder-parity check --tp N`,
`generate --tp N`): `run_tp` spawns `tp` processes (`tp * ep` with expert parallelism: ranks laid out
ep_rank * tp + tp_rank, torch_impl/expert_parallel.py) with torch.multiprocessing, joins them in one gloo (CPU)
or nccl (one GPU per rank) group and returns rank 0's result, re-raising a rank's exception with its own
type; `launch_logits`, `launch_generate`, `launch_grads` and `launch_steps` take a checkpoint path, validate the
request in the caller before any process starts, then load a shard per rank with the ordinary
`from_pretrained(..., group=...)` and call the ordinary forward / `generate` / training; `launched_groups()`
gives a worker its (tp, ep) groups. JAX needs no launcher: one process drives every device. Under torchrun,
call `from_pretrained(path, group=dist.group.WORLD)` (with expert parallelism: `group=..., ep_group=...` from
`expert_parallel.parallel_groups(tp, ep)`) and `generate` / `train_step` in each process instead, having imported
torch.distributed.nn.functional before init_process_group (`_worker` says why).
"""

from __future__ import annotations

import gc
import os
import pickle
import tempfile
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spec import ConfigError, DecoderParityError, ModelSpec, check_token_ids
from spec.checkpoint import allow_nonfinite_weights, nonfinite_weights_allowed
from spec.generation import Generation, prepare_prompts
from spec.parallel import check_ep_degree, check_tp_degree
from spec.training import AdamW
from torch_impl.expert_parallel import parallel_groups
from torch_impl.generate import generate
from torch_impl.loader import from_pretrained
from torch_impl.vocab_parallel import gather_logits

__all__ = [
    "launch_generate",
    "launch_grads",
    "launch_logits",
    "launch_steps",
    "launched_groups",
    "run_tp",
    "tp_device",
]

_GROUPS: tuple[dist.ProcessGroup | None, dist.ProcessGroup | None] = (None, None)  # this worker's (tp, ep) groups


def launched_groups() -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """In a `run_tp` worker: (tensor-parallel group, expert-parallel group) of this process, for
    `from_pretrained(path, group=..., ep_group=...)`. Without expert parallelism: (the world, None)."""
    return _GROUPS


def run_tp(
    fn: Callable[..., Any],
    tp: int,
    *args: Any,
    backend: str = "gloo",
    timeout: timedelta | None = None,
    ep: int = 1,
) -> Any:
    """Run `fn(*args)` in `tp * ep` spawned processes joined in one process group; return rank 0's result.

    The group meets through a file in a private temporary directory (no port to pick); gloo binds the
    loopback interface, nccl gives rank r the GPU cuda:r (see `tp_device`). `fn` and `args` must be
    picklable (module-level functions). A rank's exception is re-raised here with its original type
    (a DecoderParityError from any rank is preferred over the errors it causes in the others).
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tensor-parallel degree must be a positive integer, got {tp!r}")
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ConfigError(f"expert-parallel degree must be a positive integer, got {ep!r}")
    world = tp * ep
    with tempfile.TemporaryDirectory(prefix="decoder-parity-tp-") as workdir:
        try:
            # A context setting does not cross into spawned processes: hand it over (check --allow-nonfinite).
            allow = nonfinite_weights_allowed()
            spawn_args = (fn, (tp, ep), backend, workdir, timeout, allow, args)
            mp.spawn(_worker, args=spawn_args, nprocs=world, join=True)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as failure:
            _reraise(Path(workdir), world, failure.error_index, failure)
            raise
        with open(Path(workdir) / "result.pkl", "rb") as f:  # written by our rank 0 in our private directory
            return pickle.load(f)


def tp_device() -> torch.device:
    """The device of this rank in a `run_tp` group: its own GPU under nccl, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _worker(
    rank: int,
    fn: Callable[..., Any],
    degrees: tuple[int, int],
    backend: str,
    workdir: str,
    timeout: timedelta | None,
    allow_nonfinite: bool,
    args: tuple,
) -> None:
    global _GROUPS
    tp, ep = degrees
    world = tp * ep
    if backend == "gloo":
        loopback = next((name for _, name in _socket_interfaces() if name.startswith("lo")), None)
        if loopback is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)  # never leave the machine
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # ranks share the cores
    elif backend == "nccl":
        torch.cuda.set_device(rank)
    # torch.distributed.nn.functional takes `group=group.WORLD` as a default argument of ten functions, evaluated at
    # its import: imported after the group exists (the first torch.optim optimizer imports it, through
    # torch._dynamo), those defaults hold the group past destroy_process_group, and its gloo threads (gloo_tcp_loop,
    # pt_gloo_runloop) live on into the interpreter's exit, the likely cause of the rank that aborted now and then in
    # CI (SIGABRT, "terminate called without an active exception"). Imported first, the defaults are None.
    from torch.distributed.nn import functional  # noqa: F401

    kwargs = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend, init_method=f"file://{workdir}/store", rank=rank, world_size=world, **kwargs)
    try:
        _GROUPS = parallel_groups(tp, ep) if ep > 1 else (dist.group.WORLD, None)
        with allow_nonfinite_weights(allow_nonfinite):
            result = fn(*args)
        if rank == 0:
            with open(Path(workdir) / "result.pkl", "wb") as f:
                pickle.dump(result, f)
        # Every rank done before any tears the group down: a rank that left early made a peer's gloo thread
        # call std::terminate ("terminate called without an active exception", SIGABRT) in one CI run.
        dist.barrier()
    except BaseException as err:
        _save_error(Path(workdir) / f"error{rank}.pkl", err)
        raise
    finally:
        # destroy_process_group only drops c10d's own references. A group still referenced here (the global, a model
        # left in a reference cycle) would be destroyed during interpreter finalization, where gloo's threads
        # abort the rank (SIGABRT, "terminate called without an active exception", no Python frame: 2 of 25 runs
        # of the TP tests). Released first, the group dies in destroy_process_group, while the interpreter lives.
        _GROUPS = (None, None)
        result = None
        gc.collect()
        dist.destroy_process_group()


def _socket_interfaces() -> list[tuple[int, str]]:
    import socket

    try:
        return socket.if_nameindex()
    except (OSError, AttributeError):  # not on every platform
        return []


def _save_error(path: Path, err: BaseException) -> None:
    text = "".join(traceback.format_exception(err))
    try:
        payload = pickle.dumps((err, text))
    except Exception:  # an unpicklable exception: keep its text
        payload = pickle.dumps((None, text))
    path.write_bytes(payload)


def _reraise(workdir: Path, tp: int, failed_rank: int, failure: Exception) -> None:
    """Raise the exception a rank saved (its own type, its traceback as a note); return if there is none."""
    errors = {}
    for rank in range(tp):  # every rank that saved an error before spawn stopped it
        path = workdir / f"error{rank}.pkl"
        if path.is_file():
            errors[rank] = pickle.loads(path.read_bytes())  # written by our own worker, in our directory
    ours = [r for r, (err, _) in errors.items() if isinstance(err, DecoderParityError)]
    rank = ours[0] if ours else failed_rank
    if rank not in errors or errors[rank][0] is None:
        return
    err, text = errors[rank]
    if hasattr(err, "add_note"):  # Python >= 3.11
        err.add_note(f"raised on tensor-parallel rank {rank}:\n{text}")
    raise err from failure


def launch_logits(
    path: str | Path,
    input_ids: np.ndarray | Sequence[Sequence[int]],
    tp: int,
    *,
    attention_mask: np.ndarray | None = None,
    dtype: torch.dtype | str = torch.float32,
    kernels: str = "reference",
    backend: str = "gloo",
    ep: int = 1,
) -> torch.Tensor:
    """Full logits [B, T, V] of a `tp`-way sharded forward (times `ep`-way expert-parallel), gathered (the check
    path), on the CPU."""
    spec = ModelSpec.from_pretrained(path)
    check_tp_degree(spec, tp)  # fail here, before any process starts
    check_ep_degree(spec, ep)
    ids = check_token_ids(input_ids, spec)
    return run_tp(_logits_worker, tp, str(path), ids, attention_mask, dtype, kernels, backend=backend, ep=ep)


def launch_generate(
    path: str | Path,
    input_ids: np.ndarray | Sequence[Sequence[int]],
    max_new_tokens: int,
    tp: int,
    *,
    dtype: torch.dtype | str = torch.float32,
    kernels: str = "reference",
    backend: str = "gloo",
    ep: int = 1,
    **generate_kwargs: Any,
) -> Generation:
    """`generate` on a `tp`-way sharded (times `ep`-way expert-parallel) model; rank 0's Generation. A `stream`
    must be picklable (a module-level function); it runs in rank 0's process."""
    spec = ModelSpec.from_pretrained(path)
    check_tp_degree(spec, tp)
    check_ep_degree(spec, ep)
    prepare_prompts(input_ids, spec, max_new_tokens, generate_kwargs.get("attention_mask"))  # validate here
    args = (str(path), input_ids, max_new_tokens, dtype, kernels, generate_kwargs)
    return run_tp(_generate_worker, tp, *args, backend=backend, ep=ep)


def launch_grads(
    path: str | Path,
    input_ids: np.ndarray,
    tp: int,
    *,
    attention_mask: np.ndarray | None = None,
    dtype: torch.dtype | str = torch.float32,
    kernels: str = "reference",
    backend: str = "gloo",
) -> tuple[float, dict[str, np.ndarray]]:
    """torch_impl.training.loss_and_grads of a `tp`-way sharded model: the loss from the vocabulary-sharded
    logits (never gathered) and every gradient by checkpoint name, put together from the ranks' slices."""
    spec = ModelSpec.from_pretrained(path)
    check_tp_degree(spec, tp)
    ids = check_token_ids(input_ids, spec)
    return run_tp(_grads_worker, tp, str(path), ids, attention_mask, dtype, kernels, backend=backend)


def launch_steps(
    path: str | Path,
    batches: list[np.ndarray],
    config: AdamW,
    tp: int,
    *,
    dtype: torch.dtype | str = torch.float32,
    kernels: str = "reference",
    backend: str = "gloo",
) -> tuple[list[float], dict[str, np.ndarray]]:
    """AdamW steps (torch_impl.training.train_step, one per batch) of a `tp`-way sharded model: (each step's loss,
    every parameter afterwards by checkpoint name, put together from the ranks' slices)."""
    spec = ModelSpec.from_pretrained(path)
    check_tp_degree(spec, tp)
    batches = [check_token_ids(ids, spec) for ids in batches]
    return run_tp(_steps_worker, tp, str(path), batches, config, dtype, kernels, backend=backend)


def _steps_worker(path: str, batches: list[np.ndarray], config: AdamW, dtype: Any, kernels: str) -> Any:
    from torch_impl import training

    model = from_pretrained(path, dtype, device=tp_device(), kernels=kernels, group=dist.group.WORLD)
    optimizer = training.make_optimizer(model, config)
    losses = [training.train_step(model, optimizer, config, ids) for ids in batches]
    after = training.parameters(model)  # a collective: every rank takes part
    return (losses, after) if dist.get_rank() == 0 else None


def _grads_worker(path: str, ids: np.ndarray, mask: np.ndarray | None, dtype: Any, kernels: str) -> Any:
    from torch_impl.training import loss_and_grads

    model = from_pretrained(path, dtype, device=tp_device(), kernels=kernels, group=dist.group.WORLD)
    return loss_and_grads(model, ids, attention_mask=mask)


def _load(path: str, dtype: Any, kernels: str) -> Any:
    group, ep_group = launched_groups()
    return from_pretrained(path, dtype, device=tp_device(), kernels=kernels, group=group, ep_group=ep_group)


def _logits_worker(path: str, ids: np.ndarray, mask: np.ndarray | None, dtype: Any, kernels: str) -> Any:
    model = _load(path, dtype, kernels)
    with torch.inference_mode():
        logits = model(ids, attention_mask=mask)  # [B, T, shard]
        if model.layout.tp > 1:  # the explicit request: [B, T, V]
            logits = gather_logits(logits, model.spec.vocab_size, model.group)
    return logits.cpu() if dist.get_rank() == 0 else None


def _generate_worker(
    path: str, ids: Any, max_new_tokens: int, dtype: Any, kernels: str, kwargs: dict[str, Any]
) -> Generation:
    model = _load(path, dtype, kernels)
    if dist.get_rank() != 0:
        kwargs = {**kwargs, "stream": None}
    return generate(model, ids, max_new_tokens, **kwargs)
