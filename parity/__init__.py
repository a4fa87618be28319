"""decoder-parity's parity suite: run both backends on the same weights and ids, compare them component by
component against a per-dtype tolerance table, and name the first component that diverges.

    import parity
    report = parity.check()                       # built-in default checkpoint, float32
    report = parity.check(dir, dtype="bfloat16", reference="hf")
    report.passed, report.first_divergence; print(report.format()); report.save_json(path)

Importing this package imports neither torch nor JAX (nor triton): backends load when a check runs, so the
CLI can set up the Triton interpreter first. The command line is `decoder-parity check` (parity/__main__.py).
"""

from parity.api import check
from parity.compare import Comparison, ComponentResult, compare_traces
from parity.components import component_order, hf_components, layers_before
from parity.metrics import Metrics, array_metrics, logits_metrics
from parity.report import Report
from parity.request import resolve_checkpoint
from parity.tolerances import TOLERANCES, Tolerance, tolerance_for

__all__ = [
    "TOLERANCES",
    "Comparison",
    "ComponentResult",
    "Metrics",
    "Report",
    "Tolerance",
    "array_metrics",
    "check",
    "compare_traces",
    "component_order",
    "hf_components",
    "layers_before",
    "logits_metrics",
    "resolve_checkpoint",
    "tolerance_for",
]
