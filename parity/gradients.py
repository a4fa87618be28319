"""`parity.check(..., grad=True)` / `check --grad`: the loss and every parameter gradient, torch vs JAX (and
each vs transformers), in backward order; `steps=N` adds N AdamW steps in each and compares the parameters.

The same checkpoint and ids in every framework; the loss and the optimizer follow spec/training.py. Each
gradient is judged against the gradient tolerance table (parity/tolerances.py, GRAD_TOLERANCES) in the order
backpropagation reaches it (head, final norm, last layer ... first layer, embedding), so the first failure
is the first gradient a backward bug touches. One model is in memory at a time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from parity.compare import Comparison, ComponentResult, compare_traces
from parity.metrics import array_metrics
from parity.report import Report
from parity.request import KEEP_IDS
from parity.tolerances import STEP_REASON, STEP_RMS_REL, tolerance_for
from parity.trace import release_memory
from spec import ModelSpec
from spec.training import AdamW, backward_order, shift_invariant_elements

LOSS = "loss"


@dataclass
class StepResult:
    """One framework pair after N steps: the losses along the way and each parameter's update agreement."""

    test: str
    ref: str
    test_losses: list[float]
    ref_losses: list[float]
    update_rms_rel: dict[str, float]  # checkpoint name -> ||dp_test - dp_ref|| / ||dp_ref||
    bound: float
    not_compared: list[str] = field(default_factory=list)  # gradient zero in exact arithmetic: noise-driven steps

    @property
    def worst(self) -> tuple[str, float]:
        name = max(self.update_rms_rel, key=lambda n: self.update_rms_rel[n])
        return name, self.update_rms_rel[name]

    @property
    def passed(self) -> bool:
        return all(np.isfinite(v) and v <= self.bound for v in self.update_rms_rel.values())

    def to_dict(self) -> dict:
        name, value = self.worst
        return {
            "test": self.test,
            "ref": self.ref,
            "test_losses": self.test_losses,
            "ref_losses": self.ref_losses,
            "worst_parameter": name,
            "worst_update_rms_rel": value,
            "bound": self.bound,
            "passed": self.passed,
            "not_compared": self.not_compared,
        }


@dataclass
class GradReport(Report):
    """A Report whose components are the loss and the parameter gradients, in backward order."""

    order: list[str] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons) and all(s.passed for s in self.steps)

    @property
    def first_failure(self) -> tuple[Comparison, ComponentResult] | None:
        rank = {name: k for k, name in enumerate(self.order)}
        failures = [(c, c.first_failure) for c in self.comparisons if c.first_failure is not None]
        return min(failures, key=lambda cf: rank.get(cf[1].name, len(rank))) if failures else None

    def plot_names(self) -> list[str]:
        return self.order

    def plot_bound(self, name: str) -> float:
        return self.tolerance.bound(self.num_layers).max_rel

    def plot_title(self) -> str:
        return f"gradient error (backward order), {self.model['model_type']} {self.num_layers} layers, {self.dtype}"

    def verdict_line(self) -> str:
        line = super().verdict_line().replace("components", "gradients")
        failed = [s for s in self.steps if not s.passed]
        if self.first_failure is None and failed:
            s = failed[0]
            name, value = s.worst
            return (
                f"FAIL ({self.dtype}): after {len(s.test_losses)} AdamW steps ({s.test} vs {s.ref}) parameter "
                f"{name} moved differently: update rms_rel {value:.2e} > {s.bound:.2e}"
            )
        return line

    def format(self) -> str:
        text = super().format().replace("g = sqrt(1 + layers before)", "g = sqrt(1 + layers), backward order")
        if not self.steps:
            return text
        lines = ["AdamW steps (update rms_rel = ||dp_test - dp_ref|| / ||dp_ref||, worst parameter):"]
        for s in self.steps:
            name, value = s.worst
            losses = ", ".join(f"{a:.6g}/{b:.6g}" for a, b in zip(s.test_losses, s.ref_losses, strict=True))
            verdict = "ok" if s.passed else "FAIL"
            lines.append(f"  {s.test} vs {s.ref}: losses {losses}; {name} {value:.2e} <= {s.bound:.2e} {verdict}")
        noise = sorted({n for s in self.steps for n in s.not_compared})
        if noise:  # said, not hidden: their steps are driven by rounding noise (spec/training.py)
            lines.append(f"  not compared (gradient zero in exact arithmetic, the key bias): {', '.join(noise)}")
        head, _, verdict = text.rpartition("\n\n")
        return "\n\n".join([head, "\n".join(lines), verdict])

    def to_dict(self) -> dict:
        return {**super().to_dict(), "grad": True, "steps": [s.to_dict() for s in self.steps]}


def _backend(name: str):
    return importlib.import_module(f"{name}_impl")


def _training(name: str):
    return importlib.import_module(f"{name}_impl.training")


def run_grads(backend: str, directory, ids, dtype: str, kernels: str) -> tuple[float, dict[str, np.ndarray]]:
    """(loss, gradients by checkpoint name) of one framework; the model is dropped before returning."""
    if backend == "hf":
        from parity.hf_training import hf_loss_and_grads

        result = hf_loss_and_grads(directory, ids, dtype=dtype)
    else:
        model = _backend(backend).from_pretrained(directory, dtype, kernels=kernels)
        result = _training(backend).loss_and_grads(model, ids)
        del model
    release_memory()
    return result


def run_steps(
    backend: str, directory, batches: list[np.ndarray], config: AdamW, dtype: str, kernels: str, tp: int = 1
) -> tuple[list[float], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(losses, parameters before, parameters after) of N AdamW steps in one framework, on one device or
    tensor-parallel over `tp` (torch: gloo processes; JAX: a mesh). With tp > 1 the parameters before are not read
    back ({}): the caller compares against the unsharded run's."""
    if backend == "hf":
        from parity.hf_training import hf_train

        before = {}  # read from the checkpoint by the caller's torch run (the same file)
        losses, after = hf_train(directory, batches, config, dtype=dtype)
        return losses, before, after
    if backend == "torch" and tp > 1:
        from torch_impl.tp_launch import launch_steps

        losses, after = launch_steps(directory, batches, config, tp, dtype=dtype)
        return losses, {}, after
    mesh = {}
    if tp > 1:  # jax: the parameters sharded over a tp-device mesh
        from jax_impl.tensor_parallel import make_mesh

        mesh = {"mesh": make_mesh(tp)}
    training = _training(backend)
    model = _backend(backend).from_pretrained(directory, dtype, kernels=kernels, **mesh)
    before = training.parameters(model) if tp == 1 else {}
    optimizer = training.make_optimizer(model, config)
    losses = [training.train_step(model, optimizer, config, ids) for ids in batches]
    after = training.parameters(model)
    del model, optimizer
    release_memory()
    return losses, before, after


def compare_grads(
    test: tuple[float, dict], ref: tuple[float, dict], labels: tuple[str, str], spec, dtype: str
) -> Comparison:
    """The loss (as a 0-d component) and every gradient, in backward order, against the gradient table."""
    names = [LOSS, *backward_order(spec)]
    trace_test = {LOSS: np.float32(test[0]).reshape(()), **test[1]}
    trace_ref = {LOSS: np.float32(ref[0]).reshape(()), **ref[1]}
    return compare_traces(
        trace_test,
        trace_ref,
        names,
        num_layers=spec.num_hidden_layers,
        tolerance=tolerance_for(dtype, grad=True),
        test_label=labels[0],
        ref_label=labels[1],
        depth=spec.num_hidden_layers,
    )


def compare_steps(
    test: tuple, ref: tuple, before: dict[str, np.ndarray], labels: tuple[str, str], dtype: str, spec: ModelSpec
):
    """Parameters after the steps, by their change from `before`: rms-relative (STEP_REASON), over the elements
    whose gradient is not zero in exact arithmetic (spec/training.py, shift_invariant_elements: the key bias)."""
    (test_losses, _, test_after), (ref_losses, _, ref_after) = test, ref
    rel, skipped = {}, []
    for name, start in before.items():
        moved_ref = ref_after[name] - start
        moved_test = test_after[name] - start
        noise = shift_invariant_elements(spec, name, start.shape)
        if noise is not None:
            if noise.all():
                skipped.append(name)
                continue
            moved_ref, moved_test = moved_ref[~noise], moved_test[~noise]
        rel[name] = array_metrics(moved_test, moved_ref).rms_rel
    return StepResult(labels[0], labels[1], test_losses, ref_losses, rel, STEP_RMS_REL[dtype], skipped)


def _tensor_parallel(r, runs: dict, say: Callable[[str], None]) -> list[Comparison]:
    """Both backends' loss and gradients from vocabulary-sharded logits, against each other and unsharded."""
    from parity.tensor_parallel import jax_tp_grads, torch_tp_grads

    say(f"torch {r.dtype}: loss and gradients tensor-parallel over {r.tp} gloo processes")
    sharded = {"torch": torch_tp_grads(r.directory, r.ids, r.tp, r.dtype)}
    say(f"jax {r.dtype}: loss and gradients tensor-parallel over a {r.tp}-device mesh")
    sharded["jax"] = jax_tp_grads(r.directory, r.ids, r.tp, r.dtype)
    torch_tp, jax_tp = f"torch/tp{r.tp}", f"jax/tp{r.tp}"
    return [
        compare_grads(sharded["torch"], sharded["jax"], (torch_tp, jax_tp), r.spec, r.dtype),
        compare_grads(sharded["torch"], runs["torch"], (torch_tp, "torch"), r.spec, r.dtype),
        compare_grads(sharded["jax"], runs["jax"], (jax_tp, "jax"), r.spec, r.dtype),
    ]


def _tensor_parallel_steps(r, batches, config: AdamW, trained: dict, before, say) -> list[StepResult]:
    """Both backends' AdamW steps on tp devices, against each other and against their own unsharded steps."""
    say(f"torch {r.dtype}: {len(batches)} AdamW steps tensor-parallel over {r.tp} gloo processes")
    sharded = {"torch": run_steps("torch", r.directory, batches, config, r.dtype, "reference", tp=r.tp)}
    say(f"jax {r.dtype}: {len(batches)} AdamW steps tensor-parallel over a {r.tp}-device mesh")
    sharded["jax"] = run_steps("jax", r.directory, batches, config, r.dtype, "reference", tp=r.tp)
    torch_tp, jax_tp = f"torch/tp{r.tp}", f"jax/tp{r.tp}"
    return [
        compare_steps(sharded["torch"], sharded["jax"], before, (torch_tp, jax_tp), r.dtype, r.spec),
        compare_steps(sharded["torch"], trained["torch"], before, (torch_tp, "torch"), r.dtype, r.spec),
        compare_steps(sharded["jax"], trained["jax"], before, (jax_tp, "jax"), r.dtype, r.spec),
    ]


def grad_report(request, steps: int, config: AdamW | None, say: Callable[[str], None]) -> GradReport:
    """The gradient check of a validated request (parity/api.py)."""
    r, spec = request, request.spec
    config = config or AdamW()
    runs = {}
    frameworks = ["torch", "jax"] + (["hf"] if r.reference == "hf" else [])
    for backend in frameworks:
        say(f"{backend} {r.dtype}: loss and gradients")
        runs[backend] = run_grads(backend, r.directory, r.ids, r.dtype, r.kernels)
    comparisons = [compare_grads(runs["torch"], runs["jax"], ("torch", "jax"), spec, r.dtype)]
    if r.reference == "hf":
        for backend in ("torch", "jax"):
            comparisons.append(compare_grads(runs[backend], runs["hf"], (backend, "hf"), spec, r.dtype))
    if r.tp > 1:
        comparisons += _tensor_parallel(r, runs, say)
    step_results = []
    if steps:
        rng = np.random.default_rng(0)
        batches = [r.ids] + [rng.integers(0, spec.vocab_size, r.ids.shape) for _ in range(steps - 1)]
        trained = {}
        for backend in frameworks:
            say(f"{backend} {r.dtype}: {steps} AdamW steps")
            trained[backend] = run_steps(backend, r.directory, batches, config, r.dtype, r.kernels)
        before = trained["torch"][1]
        step_results.append(compare_steps(trained["torch"], trained["jax"], before, ("torch", "jax"), r.dtype, r.spec))
        if r.reference == "hf":
            for backend in ("torch", "jax"):
                labels = (backend, "hf")
                step_results.append(compare_steps(trained[backend], trained["hf"], before, labels, r.dtype, r.spec))
        if r.tp > 1:
            step_results += _tensor_parallel_steps(r, batches, config, trained, before, say)
    return GradReport(
        checkpoint=str(r.directory),
        model=spec.to_dict(),
        dtype=r.dtype,
        kernels={"torch": r.kernels, "jax": r.kernels},
        reference=r.reference,
        input_shape=tuple(int(n) for n in r.ids.shape),
        tolerance=tolerance_for(r.dtype, grad=True),
        comparisons=comparisons,
        ids=r.ids.tolist() if r.ids.size <= KEEP_IDS else None,
        order=[LOSS, *backward_order(spec)],
        steps=step_results,
    )


__all__ = ["LOSS", "STEP_REASON", "GradReport", "StepResult", "grad_report", "run_grads", "run_steps"]
