"""A validated check request: everything a check needs, settled before any model loads, and the checks that settle
it (parity/api.py's `check` builds it; the whole-model, streamed and gradient checks run it). Nothing here imports a
framework: the CLI refuses bad options before JAX starts or triton is imported (parity/environment.py)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import spec
from kernels import KERNEL_CHOICES
from parity.hf_reference import hf_available
from parity.inputs import resolve_ids
from parity.tolerances import tolerance_for
from spec import CheckpointError, InputError, ModelSpec
from spec.parallel import check_ep_degree, check_tp_degree

KEEP_IDS = 4096  # ids are stored in the report (and its JSON) up to this many, so a run can be replayed
REFERENCES = ("hf",)
ROUTING_MODES = ("free", "teacher")


@dataclass(frozen=True)
class Request:
    """A validated check: everything `check` needs, settled before any model loads."""

    directory: Path
    spec: ModelSpec
    ids: np.ndarray
    dtype: str
    kernels: str
    reference: str | None
    baseline: bool
    tp: int
    routing: str = "free"  # "free": each run routes itself; "teacher": the others get torch's expert choices
    ep: int = 1  # expert-parallel degree of the sharded runs (mixture-of-experts models)


def resolve_checkpoint(checkpoint: str | Path | None) -> Path:
    """The checkpoint directory to check: the given one, or the built-in default (written on first use)."""
    if checkpoint is None:
        return spec.default_checkpoint()
    path = Path(checkpoint)
    if not path.exists():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory (pass the checkpoint's directory, not a file in it)")
    return path


def check_stream_options(stream: bool | None, tp: int, grad: bool) -> None:
    """Refuse what a streamed check cannot combine with (the CLI asks before JAX starts, for --tp's sake)."""
    if stream and tp > 1:
        raise InputError(
            "--stream with --tp is not supported: the streamed check runs each framework unsharded, one layer at a "
            "time; drop --tp (or --stream, to compare sharded logits on a model that fits)"
        )
    if stream and grad:
        raise InputError(
            "--stream with --grad / --steps is not supported: a backward pass needs every layer's activations "
            "and weights at once; drop --stream"
        )


def check_moe_request(checkpoint: str | Path | None, ep: int, teacher: bool) -> None:
    """The CLI's early refusal of --ep / --teacher-forced-routing on a model without experts (reads the config)."""
    model_spec = ModelSpec.from_pretrained(resolve_checkpoint(checkpoint))
    if teacher:
        _refuse_dense_teacher(model_spec)
    check_ep_degree(model_spec, ep)


def _refuse_dense_teacher(model_spec: ModelSpec) -> None:
    if not model_spec.num_experts:
        raise InputError(
            f"--teacher-forced-routing needs a mixture-of-experts model ({model_spec.model_type} is dense: "
            "it has no expert choices to force)"
        )


def check_moe_options(request: Request, stream: bool | None, grad: bool) -> None:
    """Refuse what the mixture-of-experts options cannot combine with."""
    moe = request.spec.num_experts > 0
    if request.routing == "teacher":
        _refuse_dense_teacher(request.spec)
    if (request.routing == "teacher" or request.ep > 1) and grad:
        raise InputError("--teacher-forced-routing and --ep compare the forward pass: drop --grad / --steps")
    if moe and stream:
        raise InputError(
            "--stream is not supported on mixture-of-experts models yet (the streamed check compares no router or "
            "experts, and transformers' streamed pieces hold none); drop --stream"
        )


def validate_request(
    checkpoint: str | Path | None,
    dtype: str,
    kernels: str,
    reference: str | None,
    ids: np.ndarray | Sequence | str | None,
    prompt: str | None,
    seq_len: int | None,
    batch: int | None,
    seed: int,
    baseline: bool | None,
    tp: int,
    routing: str = "free",
    ep: int = 1,
) -> Request:
    """Everything that can be checked without loading a model: directory, config, options, ids, tensors."""
    directory = resolve_checkpoint(checkpoint)
    model_spec = ModelSpec.from_pretrained(directory)
    tolerance_for(dtype)  # an unknown dtype is refused here
    if kernels not in KERNEL_CHOICES:
        raise InputError(f"kernels {kernels!r} is not one of {', '.join(KERNEL_CHOICES)}")
    if reference is not None and reference not in REFERENCES:
        raise InputError(f"reference {reference!r} is not supported (choose: {', '.join(REFERENCES)})")
    token_ids = resolve_ids(model_spec, directory, ids=ids, prompt=prompt, seq_len=seq_len, batch=batch, seed=seed)
    spec.validate_checkpoint(spec.Checkpoint(directory), model_spec)  # every tensor problem, before any load
    if reference == "hf" and not hf_available():
        raise InputError(
            "--reference hf needs Hugging Face transformers, which is not installed (pip install 'decoder-parity[hf]')"
        )
    if kernels == "fused" and importlib.util.find_spec("triton") is None:
        raise InputError(
            "--kernels fused needs triton for the torch kernels, which is not installed "
            "(pip install 'decoder-parity[triton]')"
        )
    check_tp_degree(model_spec, tp)
    if routing not in ROUTING_MODES:
        raise InputError(f"routing {routing!r} is not one of {', '.join(ROUTING_MODES)}")
    check_ep_degree(model_spec, ep)  # refuses a dense model, and an ep that does not divide num_experts
    baseline = (dtype != "float32") if baseline is None else (baseline and dtype != "float32")
    return Request(directory, model_spec, token_ids, dtype, kernels, reference, baseline, tp, routing, ep)
