"""`parity.check`: the Python API behind `decoder-parity check`, for tests and notebooks.

Validates everything it can before loading a model (directory, config, dtype, kernels, ids, checkpoint
tensors), so bad input fails in a second with a `spec.DecoderParityError` that names the problem. Then it
captures torch and jax at the chosen dtype (and, for bf16/fp16, each at float32 for the drift baseline,
and transformers with reference="hf"), one model in memory at a time, and compares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from parity.capture import capture, teacher_routing
from parity.compare import Comparison, compare_traces
from parity.components import component_order, hf_components
from parity.environment import prepare_environment
from parity.report import Report
from parity.request import KEEP_IDS, Request, check_moe_options, check_stream_options, validate_request
from parity.tensor_parallel import jax_tp_logits, torch_tp_logits
from parity.tolerances import tolerance_for
from parity.trace import Capture
from spec import InputError
from spec.training import AdamW


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
    grad: bool = False,
    steps: int = 0,
    optimizer: AdamW | None = None,
    stream: bool | None = None,
    routing: str = "free",
    ep: int = 1,
) -> Report:
    """Run torch and jax on the same weights and ids and compare them component by component.

    checkpoint: a Hugging Face-layout directory (None: the built-in default). dtype: "float32",
    "bfloat16" or "float16" for both backends. kernels: "reference", "fused" or "auto". reference: "hf"
    adds transformers as a third reference. ids / prompt / seq_len / batch / seed: the input (default:
    seeded random ids [1, 16]). baseline: also run each backend at float32 to measure the dtype's own drift
    (default: whenever dtype is not float32). progress: loading progress on stderr; log: a callable that
    receives one line per stage. tp > 1: also run both backends tensor-parallel on tp devices and compare
    their logits with the unsharded runs and with each other. grad: compare the loss and every parameter
    gradient instead of the forward components (parity/gradients.py); steps > 0: also run that many AdamW
    steps (settings: `optimizer`, default spec.training.AdamW()) and compare the parameters. stream: True runs
    the layer-streamed check (parity/stream.py: one layer's weights in memory at a time, free-running and
    teacher-forced), False the whole-model one, None (default) streams when the whole-model check would not fit
    in the memory available (parity/memory.py). routing (mixture-of-experts models): "free" (each run routes
    itself; the report compares the choices, parity/routing.py) or "teacher" (jax, and transformers with
    reference="hf", are given torch's expert choices, so the experts' arithmetic is compared even where a near-tie
    flipped). ep > 1: also run both backends expert-parallel over ep (x tp) devices and compare their logits.
    Raises spec.DecoderParityError for bad input.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise InputError(f"steps must be a non-negative integer, got {steps!r}")
    check_stream_options(stream, tp, grad or bool(steps))
    request = validate_request(
        checkpoint, dtype, kernels, reference, ids, prompt, seq_len, batch, seed, baseline, tp, routing, ep
    )  # fmt: skip
    check_moe_options(request, stream, grad or bool(steps))
    if steps and request.dtype == "float16":
        raise InputError(
            "--steps in float16 compares nothing: AdamW on float16 parameters and moments (torch's own, as "
            "transformers runs it) underflows the second moment and overflows within a few steps (measured on the "
            "built-in checkpoint: transformers, torch_impl and jax_impl all reach inf by step 8). Use bfloat16 or "
            "float32 for --steps; --grad alone works in float16"
        )
    prepare_environment(request.kernels, request.tp * request.ep)  # before triton is imported or JAX starts
    say = log or (lambda _line: None)
    if grad or steps:
        from parity.gradients import grad_report

        return grad_report(request, steps, optimizer, say)
    if stream is None and tp == 1 and not request.spec.num_experts:  # the streamed check has no moe.* pieces yet
        from parity.memory import should_stream

        stream = should_stream(request, say)
    if stream:
        from parity.stream import StreamedRun

        return StreamedRun(request, progress, say).report()
    return _Run(request, progress, say).report()


class _Run:
    """The stages of one check, in the order they hold memory: one model at a time, and only the traces
    still to be compared (each float32 baseline is compared with its backend's run at once and dropped)."""

    def __init__(self, request: Request, progress: bool, say: Callable[[str], None]):
        self.request, self.progress, self.say = request, progress, say
        self.names = component_order(request.spec.num_hidden_layers, request.spec)
        self.timings: dict[str, dict[str, float]] = {}

    def capture(self, backend: str, dtype: str, kernels: str, routing: dict | None = None) -> Capture:
        r = self.request
        forced = " with torch's expert choices" if routing is not None else ""
        self.say(f"{backend} {dtype} (kernels={kernels}){forced}: loading {r.directory}")
        cap = capture(
            backend, r.directory, r.ids, dtype=dtype, kernels=kernels, progress=self.progress, routing=routing
        )
        self.timings[f"{backend}/{dtype}"] = {"load_s": round(cap.load_s, 3), "run_s": round(cap.run_s, 3)}
        self.say(f"{backend} {dtype}: loaded in {cap.load_s:.1f}s, traced forward in {cap.run_s:.1f}s")
        return cap

    def compare(self, test: dict, ref: dict, labels: tuple[str, str], on: list[str] | None = None) -> Comparison:
        return compare_traces(
            test,
            ref,
            self.names if on is None else on,
            num_layers=self.request.spec.num_hidden_layers,
            tolerance=tolerance_for(self.request.dtype),
            test_label=labels[0],
            ref_label=labels[1],
        )

    def drift(self, run: Capture) -> Comparison:
        """A backend's run against its own float32 reference run: the dtype's own error."""
        own = self.capture(run.backend, "float32", "reference").trace
        return self.compare(run.trace, own, (run.backend, f"{run.backend}/float32"))

    def tensor_parallel(self, torch_run: Capture, jax_run: Capture) -> list[Comparison]:
        """Both backends' sharded logits against each other and against their own unsharded runs."""
        r, on = self.request, ["logits"]
        what = "tensor-parallel" if r.ep == 1 else f"tensor-parallel {r.tp} x expert-parallel {r.ep}"
        self.say(f"torch {r.dtype}: {what} over {r.tp * r.ep} gloo processes")
        sharded_torch = {"logits": torch_tp_logits(r.directory, r.ids, r.tp, r.dtype, ep=r.ep)}
        self.say(f"jax {r.dtype}: {what} over a {r.tp * r.ep}-device mesh")
        sharded_jax = {"logits": jax_tp_logits(r.directory, r.ids, r.tp, r.dtype, ep=r.ep)}
        degree = f"tp{r.tp}" if r.ep == 1 else (f"ep{r.ep}" if r.tp == 1 else f"tp{r.tp}ep{r.ep}")
        torch_tp, jax_tp = f"torch/{degree}", f"jax/{degree}"
        return [
            self.compare(sharded_torch, sharded_jax, (torch_tp, jax_tp), on),
            self.compare(sharded_torch, torch_run.trace, (torch_tp, "torch"), on),
            self.compare(sharded_jax, jax_run.trace, (jax_tp, "jax"), on),
        ]

    def report(self) -> Report:
        r = self.request
        drift: list[Comparison] = []
        torch_run = self.capture("torch", r.dtype, r.kernels)
        if r.baseline:
            drift.append(self.drift(torch_run))
        forced = teacher_routing(torch_run.trace, r.spec.sparse_layers) if r.routing == "teacher" else None
        jax_run = self.capture("jax", r.dtype, r.kernels, forced)
        comparisons = [self.compare(torch_run.trace, jax_run.trace, ("torch", "jax"))]
        if r.reference == "hf":
            hf_trace = self.capture("hf", r.dtype, "-", forced).trace
            for cap in (torch_run, jax_run):
                on = hf_components(r.spec.num_hidden_layers, r.spec)
                comparisons.append(self.compare(cap.trace, hf_trace, (cap.backend, "hf"), on))
            del hf_trace
        if forced is not None:
            given = "jax and transformers were" if r.reference == "hf" else "jax was"
            for c in comparisons:
                c.routing_note = f"teacher-forced: {given} given torch's expert choices"
        if r.tp > 1 or r.ep > 1:
            comparisons += self.tensor_parallel(torch_run, jax_run)
        resolved = {"torch": torch_run.kernels, "jax": jax_run.kernels}
        del torch_run
        if r.baseline:
            drift.append(self.drift(jax_run))
        del jax_run
        return Report(
            checkpoint=str(r.directory),
            model=r.spec.to_dict(),
            dtype=r.dtype,
            kernels=resolved,
            reference=r.reference,
            input_shape=tuple(int(n) for n in r.ids.shape),
            tolerance=tolerance_for(r.dtype),
            comparisons=comparisons,
            drift=drift,
            timings=self.timings,
            ids=r.ids.tolist() if r.ids.size <= KEEP_IDS else None,
        )


__all__ = ["check"]
