"""Walk two traces in forward order and hold every component to its tolerance.

The result names the first component outside tolerance, not just a verdict on the logits: a bug shows up
first where it is introduced (a wrong activation at `layers.0.mlp.act`, a wrong mask at `layers.0.attn_out`)
and everything downstream merely inherits it. The components two correct implementations compute bit for bit
(parity/tolerances.py EXACT_COMPONENTS: the embedding) are held to identity, so a difference there far below the
dtype's rounding (Gemma's embedding scale multiplied in float32 instead of the dtype) is still found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from parity.components import LOGITS, layers_before
from parity.metrics import Metrics, array_metrics, logits_metrics
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
        }


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

    `depth`: one depth for every name (gradients: the whole model); default, each forward component's own."""
    comparison = Comparison(test_label, ref_label, tolerance.dtype)
    for name in names:
        comparison.results.append(
            judge(
                name,
                test.get(name),
                ref.get(name),
                num_layers=num_layers,
                tolerance=tolerance,
                test_label=test_label,
                ref_label=ref_label,
                depth=depth,
            )
        )
    return comparison
