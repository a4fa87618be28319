"""Launching a tensor-parallel run: a local process group, rank 0's result back in the caller.

Companion of torch_impl/tensor_parallel.py (the sharded model and greedy decoding) and what a CLI calls
(`decoder-parity check --tp N`, `generate --tp N`): `run_tp` spawns `tp_size` processes with
torch.multiprocessing, joins them in one gloo (CPU) or nccl (one GPU per rank) group and returns rank 0's
result, re-raising a rank's exception with its own type; `tp_logits` and `tp_generate` validate the
request in the caller, before any process starts, then load a shard per rank. Under torchrun, call
`from_pretrained_tp` / `generate_tp` directly in each process instead.
"""

from __future__ import annotations

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
from spec.generation import Generation, prepare_prompts
from torch_impl.tensor_parallel import check_tp_degree, from_pretrained_tp, generate_tp
from torch_impl.vocab_parallel import gather_logits

__all__ = ["run_tp", "tp_device", "tp_generate", "tp_logits"]


def run_tp(
    fn: Callable[..., Any], tp_size: int, *args: Any, backend: str = "gloo", timeout: timedelta | None = None
) -> Any:
    """Run `fn(*args)` in `tp_size` spawned processes joined in one process group; return rank 0's result.

    The group meets through a file in a private temporary directory (no port to pick); gloo binds the
    loopback interface, nccl gives rank r the GPU cuda:r (see `tp_device`). `fn` and `args` must be
    picklable (module-level functions). A rank's exception is re-raised here with its original type
    (a DecoderParityError from any rank is preferred over the errors it causes in the others).
    """
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ConfigError(f"tensor-parallel degree must be a positive integer, got {tp_size!r}")
    with tempfile.TemporaryDirectory(prefix="decoder-parity-tp-") as workdir:
        try:
            mp.spawn(_worker, args=(fn, tp_size, backend, workdir, timeout, args), nprocs=tp_size, join=True)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as failure:
            _reraise(Path(workdir), tp_size, failure.error_index, failure)
            raise
        with open(Path(workdir) / "result.pkl", "rb") as f:  # written by our rank 0 in our private directory
            return pickle.load(f)


def tp_device() -> torch.device:
    """The device of this rank in a `run_tp` group: its own GPU under nccl, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _worker(
    rank: int, fn: Callable[..., Any], tp_size: int, backend: str, workdir: str, timeout: timedelta | None, args: tuple
) -> None:
    if backend == "gloo":
        loopback = next((name for _, name in _socket_interfaces() if name.startswith("lo")), None)
        if loopback is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)  # never leave the machine
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp_size))  # ranks share the cores
    elif backend == "nccl":
        torch.cuda.set_device(rank)
    kwargs = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend, init_method=f"file://{workdir}/store", rank=rank, world_size=tp_size, **kwargs)
    try:
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


def _reraise(workdir: Path, tp_size: int, failed_rank: int, failure: Exception) -> None:
    """Raise the exception a rank saved (its own type, its traceback as a note); return if there is none."""
    errors = {}
    for rank in range(tp_size):  # every rank that saved an error before spawn stopped it
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


def tp_logits(
    path: str | Path,
    input_ids: np.ndarray | Sequence[Sequence[int]],
    tp_size: int,
    *,
    attention_mask: np.ndarray | None = None,
    dtype: torch.dtype | str = torch.float32,
    kernels: str = "reference",
    backend: str = "gloo",
) -> torch.Tensor:
    """Full logits [B, T, V] of a `tp_size`-way sharded forward, gathered (the check path), on the CPU."""
    spec = ModelSpec.from_pretrained(path)
    check_tp_degree(spec, tp_size)  # fail here, before any process starts
    ids = check_token_ids(np.asarray(input_ids), spec)
    return run_tp(_logits_worker, tp_size, str(path), ids, attention_mask, dtype, kernels, backend=backend)


def tp_generate(
    path: str | Path,
    input_ids: np.ndarray | Sequence[Sequence[int]],
    max_new_tokens: int,
    tp_size: int,
    *,
    dtype: torch.dtype | str = torch.float32,
    kernels: str = "reference",
    backend: str = "gloo",
    **generate_kwargs: Any,
) -> Generation:
    """`generate_tp` on a `tp_size`-way sharded model; rank 0's Generation. A `stream` must be picklable
    (a module-level function); it runs in rank 0's process."""
    spec = ModelSpec.from_pretrained(path)
    check_tp_degree(spec, tp_size)
    prepare_prompts(input_ids, spec, max_new_tokens, generate_kwargs.get("attention_mask"))  # validate here
    args = (str(path), input_ids, max_new_tokens, dtype, kernels, generate_kwargs)
    return run_tp(_generate_worker, tp_size, *args, backend=backend)


def _logits_worker(path: str, ids: np.ndarray, mask: np.ndarray | None, dtype: Any, kernels: str) -> Any:
    model = from_pretrained_tp(path, dtype, device=tp_device(), kernels=kernels)
    with torch.inference_mode():
        local = model(ids, attention_mask=mask)  # [B, T, shard]
        full = gather_logits(local, model.spec.vocab_size, model.group)  # the explicit request: [B, T, V]
    return full.cpu() if dist.get_rank() == 0 else None


def _generate_worker(
    path: str, ids: Any, max_new_tokens: int, dtype: Any, kernels: str, kwargs: dict[str, Any]
) -> Generation:
    model = from_pretrained_tp(path, dtype, device=tp_device(), kernels=kernels)
    if dist.get_rank() != 0:
        kwargs = {**kwargs, "stream": None}
    return generate_tp(model, ids, max_new_tokens, **kwargs)
