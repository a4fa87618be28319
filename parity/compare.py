"""Walk two traces in forward order and hold every component to its tolerance.

The result names the first component outside tolerance, not just a verdict on the logits: a bug shows up
first where it is introduced (a wrong activation at `layers.0.mlp.act`, a wrong mask at `layers.0.attn_out`)
and everything downstream merely inherits it. The components two correct implementations compute bit for bit
(parity/tolerances.py EXACT_COMPONENTS: the embedding) are held to identity, so a difference there far below the
dtype's rounding (Gemma's embedding scale multiplied in float32 instead of the dtype) is still found.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from parity.components import LOGITS, layers_before
from parity.metrics import Metrics, array_metrics, logits_metrics
from parity.routing import LayerRouting, Masks, analyse_layer, canonical, masked
from parity.tolerances import EXACT_COMPONENTS, Bound, Tolerance


@dataclass(frozen=True)
class ComponentResult:
    name: str
    layers_before: int
    metrics: Metrics | None  # None when the component could not be compared (missing, shape mismatch)
    bound: Bound
    kl_bound: float | None  # logits only
    passed: bool
    reason: str  # why it failed ("" when it passed)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "layers_before": self.layers_before,
            "passed": self.passed,
            "reason": self.reason,
            "metrics": None if self.metrics is None else self.metrics.to_dict(),
            "bound": {
                "max_rel": self.bound.max_rel,
                "min_cosine": self.bound.min_cosine,
                "rms_rel": self.bound.rms_rel,
                "kl_max": self.kl_bound,
            },
        }


@dataclass
class Comparison:
    """`test` against `ref` at one dtype, component by component, in forward order."""

    test: str  # e.g. "jax"
    ref: str  # e.g. "torch"
    dtype: str
    results: list[ComponentResult] = field(default_factory=list)
    routing: list[LayerRouting] = field(default_factory=list)  # per sparse layer (mixture of experts)
    routing_note: str = ""  # how the routing was obtained ("teacher-forced: ..."), "" when each run chose its own

    @property
    def label(self) -> str:
        return f"{self.test} vs {self.ref}"

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def first_failure(self) -> ComponentResult | None:
        return next((r for r in self.results if not r.passed), None)

    def result(self, name: str) -> ComponentResult:
        return next(r for r in self.results if r.name == name)

    def to_dict(self) -> dict:
        first = self.first_failure
        return {
            "test": self.test,
            "ref": self.ref,
            "dtype": self.dtype,
            "passed": self.passed,
            "first_failure": None if first is None else first.name,
            "components": [r.to_dict() for r in self.results],
            "routing": [r.to_dict() for r in self.routing],
            "routing_note": self.routing_note,
        }

    @property
    def masked(self) -> bool:
        """Whether components were compared with the tokens downstream of a near-tie flip left out."""
        return any(r.near_tie_flips for r in self.routing)


def judge(
    name: str,
    test: np.ndarray | None,
    ref: np.ndarray | None,
    *,
    num_layers: int,
    tolerance: Tolerance,
    test_label: str = "test",
    ref_label: str = "ref",
    depth: int | None = None,
) -> ComponentResult:
    """Compare one component and decide; the reason names the criterion that failed, with both numbers.

    `depth` (the g of the tolerance table) defaults to the layers before a forward component."""
    depth = layers_before(name, num_layers) if depth is None else depth
    bound = tolerance.bound(depth)

    def fail(reason: str, metrics: Metrics | None = None, kl_bound: float | None = None) -> ComponentResult:
        return ComponentResult(name, depth, metrics, bound, kl_bound, False, reason)

    if test is None or ref is None:
        missing = [label for label, value in ((test_label, test), (ref_label, ref)) if value is None]
        return fail(f"not traced by {' and '.join(missing)}")
    if test.shape != ref.shape:
        return fail(f"shape {list(test.shape)} ({test_label}) != {list(ref.shape)} ({ref_label})")
    metrics = logits_metrics(test, ref) if name == LOGITS else array_metrics(test, ref)
    kl_bound = bound.kl_max(metrics.ref_rms) if metrics.ref_rms is not None else None
    if not metrics.finite:
        bad = [label for label, value in ((test_label, test), (ref_label, ref)) if not np.isfinite(value).all()]
        return fail(f"non-finite values (NaN or inf) in {' and '.join(bad)}", metrics, kl_bound)
    problems = []
    if name in EXACT_COMPONENTS and metrics.max_abs != 0.0 and _in_dtype(ref, tolerance.dtype):
        differ = int(np.count_nonzero(test != ref))
        problems.append(f"not bit-identical: {differ} of {ref.size} elements differ (exact component)")
    if not metrics.max_rel <= bound.max_rel:
        problems.append(f"max_rel {metrics.max_rel:.2e} > {bound.max_rel:.2e}")
    if not metrics.cosine >= bound.min_cosine:
        problems.append(f"1-cos {1 - metrics.cosine:.2e} > {1 - bound.min_cosine:.2e}")
    if kl_bound is not None and not metrics.kl_max <= kl_bound:
        problems.append(f"KL {metrics.kl_max:.2e} > {kl_bound:.2e}")
    if problems:
        return fail(", ".join(problems), metrics, kl_bound)
    return ComponentResult(name, depth, metrics, bound, kl_bound, True, "")


def _in_dtype(values: np.ndarray, dtype: str) -> bool:
    """Whether float32 `values` are all values of `dtype`: bit identity is expected only between two runs at the
    same dtype, not against a float32 drift baseline."""
    if dtype == "float32":
        return True
    import ml_dtypes

    narrow = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return bool(np.array_equal(values, values.astype(narrow).astype(np.float32)))


def compare_traces(
    test: Mapping[str, np.ndarray],
    ref: Mapping[str, np.ndarray],
    names: list[str],
    *,
    num_layers: int,
    tolerance: Tolerance,
    test_label: str = "test",
    ref_label: str = "ref",
    depth: int | None = None,
) -> Comparison:
    """Compare `test` against `ref` on `names` (in their order); every component is judged, not only the first.

    `depth`: one depth for every name (gradients: the whole model); default, each forward component's own.
    A sparse layer's moe.topk_ids is judged by its routing agreement (parity/routing.py), and the tokens
    downstream of a near-tie flip are left out of the later components."""
    comparison = Comparison(test_label, ref_label, tolerance.dtype)
    masks = _masks(test, ref, names)
    for name in names:
        a, b = test.get(name), ref.get(name)
        routing = None
        if masks is not None and a is not None and b is not None and a.shape == b.shape:
            if name.endswith("moe.topk_ids"):
                routing = _route(name, a, b, ref, masks, tolerance)
                comparison.routing.append(routing)
            a, b = _canonical(name, a, b, test, ref)
            a = masked(a, b, masks.mask(name, num_layers))
        result = judge(
            name,
            a,
            b,
            num_layers=num_layers,
            tolerance=tolerance,
            test_label=test_label,
            ref_label=ref_label,
            depth=depth,
        )
        if routing is not None and routing.failures:
            failures = routing.failures
            reason = failures[0].describe(routing.layer, test_label, ref_label)
            reason += f" ({len(failures)} failing choice{'s' if len(failures) > 1 else ''} in the layer)"
            result = dataclasses.replace(result, passed=False, reason=reason)
        comparison.results.append(result)
    return comparison


def _masks(test: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], names: list[str]) -> Masks | None:
    """Masks for a mixture-of-experts comparison (None when neither trace routes: nothing to mask)."""
    routed = [n for n in names if n.endswith("moe.topk_ids") and n in test and n in ref]
    if not routed:
        return None
    return Masks(tuple(ref[routed[0]].shape[:2]))


def _route(name: str, test_ids, ref_ids, ref: Mapping[str, np.ndarray], masks: Masks, tol: Tolerance) -> LayerRouting:
    layer = int(name.split(".")[1])
    logits = ref.get(name.replace("topk_ids", "router_logits"))
    if logits is None or logits.shape[:2] != ref_ids.shape[:2]:
        logits = np.zeros((*ref_ids.shape[:2], int(ref_ids.max(initial=0)) + 1), np.float32)  # no margins known
    routing = analyse_layer(layer, test_ids, ref_ids, logits, masks.before(layer), tol)
    masks.add(routing)
    return routing


def _canonical(name: str, a: np.ndarray, b: np.ndarray, test: Mapping, ref: Mapping) -> tuple[np.ndarray, np.ndarray]:
    """topk_ids and topk_weights sorted by expert id: choices are compared as sets (parity/routing.py says why)."""
    if name.endswith("moe.topk_ids"):
        return canonical(a)[0], canonical(b)[0]
    if name.endswith("moe.topk_weights"):
        ids = name.replace("topk_weights", "topk_ids")
        if ids in test and ids in ref and test[ids].shape == a.shape and ref[ids].shape == b.shape:
            return canonical(test[ids], a)[1], canonical(ref[ids], b)[1]
    return a, b
