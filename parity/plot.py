"""`--plot`: the per-layer error of the residual stream (x1 and x2 of every layer, then the logits), or with
`--grad` each parameter gradient's error in backward order (the report says what to draw: Report.plot_names).

For bf16/fp16 it draws each backend's error against its own float32 run (what the dtype costs) next to
the torch-vs-jax discrepancy at that dtype and the tolerance; for float32 there is no float32 baseline
to draw, so it shows the cross-backend error and the tolerance. matplotlib runs on the Agg backend: no
display needed.
"""

from __future__ import annotations

from pathlib import Path

from parity.compare import Comparison
from parity.report import Report
from spec import InputError

_FLOOR = 1e-12  # a log axis cannot show an exact 0 (e.g. bit-identical bf16 layers): draw it at the floor


def _series(comparison: Comparison, names: list[str]) -> list[float]:
    values = []
    for name in names:
        result = next((r for r in comparison.results if r.name == name), None)
        metric = None if result is None or result.metrics is None else result.metrics.max_rel
        values.append(float("nan") if metric is None else max(metric, _FLOOR))
    return values


def plot_report(report: Report, path: str | Path) -> Path:
    """Write the residual-stream error plot of `report` to `path` (format from the suffix: .png, .svg, .pdf)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise InputError(
            "--plot needs matplotlib, which is not installed (pip install 'decoder-parity[plot]')"
        ) from err
    names = report.plot_names()
    xs = list(range(len(names)))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * len(names) + 3), 4.5))
    styles = {
        "drift": dict(linestyle="-", marker="o", markersize=3),
        "cross": dict(linestyle="--", marker="s", markersize=3),
    }
    for drift in report.drift:
        ax.plot(xs, _series(drift, names), label=f"{drift.test} {report.dtype} vs {drift.ref}", **styles["drift"])
    for comparison in report.comparisons:
        present = [n for n in names if any(r.name == n for r in comparison.results)]
        xs_c = [xs[names.index(n)] for n in present]
        ax.plot(xs_c, _series(comparison, present), label=f"{comparison.label} ({report.dtype})", **styles["cross"])
    tol = [report.plot_bound(n) for n in names]
    ax.plot(xs, tol, color="black", linewidth=1, label=f"{report.dtype} tolerance (max_rel)")
    failure = report.first_failure
    if failure is not None and failure[1].name in names:
        ax.axvline(
            names.index(failure[1].name), color="red", linewidth=0.8, label=f"first divergence: {failure[1].name}"
        )
    ax.set_yscale("log")
    ax.set_ylabel("max|a - b| / max|b|")
    step = max(1, len(names) // 40)  # keep tick labels readable for deep models
    ax.set_xticks(xs[::step], [n.removeprefix("layers.") for n in names][::step], rotation=90, fontsize=7)
    ax.set_title(report.plot_title())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path)
    except (OSError, ValueError) as err:
        raise InputError(f"cannot write the plot to {path}: {err}") from err
    finally:
        plt.close(fig)
    return path
