"""`parity.check`: the Python API behind `decoder-parity check`, for tests and notebooks.

Validates everything it can before loading a model (directory, config, dtype, kernels, ids, checkpoint
tensors), so bad input fails in a second with a `spec.DecoderParityError` that names the problem. Then it
captures torch and jax at the chosen dtype (and, for bf16/fp16, each at float32 for the drift baseline,
and transformers with reference="hf"), one model in memory at a time, and compares.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

import spec
from kernels import KERNEL_CHOICES
from parity.capture import Capture, capture, prepare_kernels
from parity.compare import Comparison, compare_traces
from parity.components import component_order, hf_components
from parity.inputs import resolve_ids
from parity.report import Report
from parity.tolerances import tolerance_for
from spec import CheckpointError, InputError, ModelSpec

REFERENCES = ("hf",)
_KEEP_IDS = 4096  # ids are stored in the report (and its JSON) up to this many, so a run can be replayed


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


def check(
    checkpoint: str | Path | None = None,
    *,
    dtype: str = "float32",
    kernels: str = "reference",
    reference: str | None = None,
    ids: np.ndarray | Sequence | str | None = None,
    prompt: str | None = None,
    seq_len: int | None = None,
    batch: int | None = None,
    seed: int = 0,
    baseline: bool | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
    tp: int = 1,
) -> Report:
    """Run torch and jax on the same weights and ids and compare them component by component.

    checkpoint: a Hugging Face-layout directory (None: the built-in default). dtype: "float32",
    "bfloat16" or "float16" for both backends. kernels: "reference", "fused" or "auto". reference: "hf"
    adds transformers as a third reference. ids / prompt / seq_len / batch / seed: the input (default:
    seeded random ids [1, 16]). baseline: also run each backend at float32 to measure the dtype's own drift
    (default: whenever dtype is not float32). progress: loading progress on stderr; log: a callable that
    receives one line per stage. tp > 1: also run both backends tensor-parallel on tp devices and compare
    their logits with the unsharded runs and with each other. Raises spec.DecoderParityError for bad input.
    """
    directory = resolve_checkpoint(checkpoint)
    model_spec = ModelSpec.from_pretrained(directory)
    tolerance = tolerance_for(dtype)
    if kernels not in KERNEL_CHOICES:
        raise InputError(f"kernels {kernels!r} is not one of {', '.join(KERNEL_CHOICES)}")
    if reference is not None and reference not in REFERENCES:
        raise InputError(f"reference {reference!r} is not supported (choose: {', '.join(REFERENCES)})")
    token_ids = resolve_ids(model_spec, directory, ids=ids, prompt=prompt, seq_len=seq_len, batch=batch, seed=seed)
    spec.validate_checkpoint(spec.Checkpoint(directory), model_spec)  # every tensor problem, before any load
    if reference == "hf":
        from parity.hf_reference import hf_available

        if not hf_available():
            raise InputError(
                "--reference hf needs Hugging Face transformers, which is not installed "
                "(pip install 'decoder-parity[hf]')"
            )
    if kernels == "fused" and importlib.util.find_spec("triton") is None:
        raise InputError(
            "--kernels fused needs triton for the torch kernels, which is not installed "
            "(pip install 'decoder-parity[triton]')"
        )
    if tp > 1:
        from spec.parallel import check_tp_degree

        check_tp_degree(model_spec, tp)
    prepare_kernels(kernels)
    baseline = (dtype != "float32") if baseline is None else (baseline and dtype != "float32")
    say = log or (lambda _line: None)
    num_layers = model_spec.num_hidden_layers
    names = component_order(num_layers)
    timings: dict[str, dict[str, float]] = {}

    def run(backend: str, run_dtype: str, run_kernels: str) -> Capture:
        say(f"{backend} {run_dtype} (kernels={run_kernels}): loading {directory}")
        cap = capture(backend, directory, token_ids, dtype=run_dtype, kernels=run_kernels, progress=progress)
        timings[f"{backend}/{run_dtype}"] = {"load_s": round(cap.load_s, 3), "run_s": round(cap.run_s, 3)}
        say(f"{backend} {run_dtype}: loaded in {cap.load_s:.1f}s, traced forward in {cap.run_s:.1f}s")
        return cap

    def compare(test: dict, ref: dict, labels: tuple[str, str], on: list[str] = names) -> Comparison:
        return compare_traces(
            test, ref, on, num_layers=num_layers, tolerance=tolerance, test_label=labels[0], ref_label=labels[1]
        )

    # One model in memory at a time, and only the traces still to be compared: each float32 baseline is
    # compared with its backend's run at once and dropped; torch's trace goes before jax's baseline loads.
    drift: list[Comparison] = []
    torch_run = run("torch", dtype, kernels)
    if baseline:
        drift.append(compare(torch_run.trace, run("torch", "float32", "reference").trace, ("torch", "torch/float32")))
    jax_run = run("jax", dtype, kernels)
    comparisons = [compare(torch_run.trace, jax_run.trace, ("torch", "jax"))]
    if reference == "hf":
        hf_trace = run("hf", dtype, "-").trace
        for cap in (torch_run, jax_run):
            comparisons.append(compare(cap.trace, hf_trace, (cap.backend, "hf"), hf_components(num_layers)))
        del hf_trace
    if tp > 1:
        from parity.tensor_parallel import jax_tp_logits, torch_tp_logits

        say(f"torch {dtype}: tensor-parallel over {tp} gloo processes")
        sharded = {"torch": {"logits": torch_tp_logits(directory, token_ids, tp, dtype)}}
        say(f"jax {dtype}: tensor-parallel over a {tp}-device mesh")
        sharded["jax"] = {"logits": jax_tp_logits(directory, token_ids, tp, dtype)}
        on = ["logits"]
        comparisons.append(compare(sharded["torch"], sharded["jax"], (f"torch/tp{tp}", f"jax/tp{tp}"), on))
        comparisons.append(compare(sharded["torch"], torch_run.trace, (f"torch/tp{tp}", "torch"), on))
        comparisons.append(compare(sharded["jax"], jax_run.trace, (f"jax/tp{tp}", "jax"), on))
    resolved = {"torch": torch_run.kernels, "jax": jax_run.kernels}
    del torch_run
    if baseline:
        drift.append(compare(jax_run.trace, run("jax", "float32", "reference").trace, ("jax", "jax/float32")))
    del jax_run
    return Report(
        checkpoint=str(directory),
        model=model_spec.to_dict(),
        dtype=dtype,
        kernels=resolved,
        reference=reference,
        input_shape=tuple(int(n) for n in token_ids.shape),
        tolerance=tolerance,
        comparisons=comparisons,
        drift=drift,
        timings=timings,
        ids=token_ids.tolist() if token_ids.size <= _KEEP_IDS else None,
    )


__all__ = ["REFERENCES", "check", "resolve_checkpoint"]
