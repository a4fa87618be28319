"""The result of a parity check: comparisons, the first divergence, a printable table, JSON.

`comparisons` carry the verdict (torch vs jax, and each backend vs transformers with `--reference hf`);
`drift` is informational: each backend at the chosen dtype against its own float32 run, i.e. what the
low-precision dtype itself costs (what --plot draws). Drift has no verdict: two correct models drift alike.
A streamed check (`mode="streamed"`, parity/stream.py) also carries `teacher_forced`: the same comparisons with
every layer given the teacher's input, which localize a divergence (a column beside the free-running numbers)
and have no verdict either.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from parity.compare import Comparison, ComponentResult
from parity.components import forward_order, layers_before, residual_stream
from parity.tolerances import Tolerance


@dataclass
class Report:
    checkpoint: str
    model: dict  # a summary of the ModelSpec
    dtype: str
    kernels: dict[str, str]  # backend -> kernels it ran ("reference" | "fused")
    reference: str | None  # "hf" or None
    input_shape: tuple[int, int]
    tolerance: Tolerance
    comparisons: list[Comparison] = field(default_factory=list)
    drift: list[Comparison] = field(default_factory=list)
    timings: dict[str, dict[str, float]] = field(default_factory=dict)  # capture label -> load_s, run_s
    ids: list[list[int]] | None = None  # kept when small, so a JSON report can be replayed
    teacher_forced: list[Comparison] = field(default_factory=list)  # streamed: each piece given the teacher's x
    teacher: str | None = None  # streamed: the run whose x the teacher-forced pieces get ("torch" or "hf")
    mode: str = "whole"  # "whole" (every model whole, one at a time) or "streamed" (one layer at a time)

    @property
    def num_layers(self) -> int:
        return int(self.model["num_hidden_layers"])

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    @property
    def first_failure(self) -> tuple[Comparison, ComponentResult] | None:
        """The earliest failing component in forward order over all comparisons (ties: the first comparison)."""
        order = forward_order(self.num_layers)
        failures = [(c, c.first_failure) for c in self.comparisons if c.first_failure is not None]
        if not failures:
            return None
        return min(failures, key=lambda cf: order.get(cf[1].name, len(order)))

    @property
    def first_divergence(self) -> str | None:
        """The name of the first component outside tolerance (None when parity holds)."""
        failure = self.first_failure
        return None if failure is None else failure[1].name

    # ---- what --plot draws (parity/plot.py) ----------------------------------------------------------------
    def plot_names(self) -> list[str]:
        """The residual stream: x1 and x2 of every layer, then the logits."""
        return residual_stream(self.num_layers)

    def plot_bound(self, name: str) -> float:
        return self.tolerance.bound(layers_before(name, self.num_layers)).max_rel

    def plot_title(self) -> str:
        return f"residual-stream error, {self.model['model_type']} {self.num_layers} layers, {self.dtype}"

    def comparison(self, test: str, ref: str) -> Comparison:
        return next(c for c in self.comparisons + self.drift if (c.test, c.ref) == (test, ref))

    def verdict_line(self) -> str:
        failure = self.first_failure
        where = f"{self.dtype}, kernels={'/'.join(sorted(set(self.kernels.values())))}"
        if failure is None:
            parts = [f"{c.label} on {len(c.results)} components{_routing_part(c)}" for c in self.comparisons]
            return f"PASS ({where}): parity holds: {'; '.join(parts)}"
        comparison, result = failure
        return f"FAIL ({where}): first divergence at {result.name} ({comparison.label}): {result.reason}"

    def forced_failures(self) -> list[ComponentResult]:
        """The teacher-forced results outside tolerance, over every comparison, in forward order."""
        order = forward_order(self.num_layers)
        failed = [r for c in self.teacher_forced for r in c.results if not r.passed]
        return sorted(failed, key=lambda r: order.get(r.name, len(order)))

    def forced_pieces(self) -> list[str]:
        """The pieces (embed, "layers.i", head) holding a teacher-forced failure: where the divergence enters."""
        pieces = [
            ".".join(r.name.split(".")[:2]) if r.name.startswith("layers.") else r.name for r in self.forced_failures()
        ]
        return list(dict.fromkeys("head" if p in ("final_norm", "logits") else p for p in pieces))

    def forced_line(self) -> str | None:
        """What teacher forcing localizes (streamed checks only)."""
        if not self.teacher_forced:
            return None
        given = f"teacher-forced (every layer given {self.teacher}'s input)"
        failures = self.forced_failures()
        if not failures:
            return f"{given}: every component within tolerance"
        return f"{given}: first at {failures[0].name}; diverging pieces: {', '.join(self.forced_pieces())}"

    # ---- text -----------------------------------------------------------------------------------------
    def format(self) -> str:
        m = self.model
        head = (
            f"decoder-parity check: {self.checkpoint}\n"
            f"  model {m['model_type']}: {m['num_hidden_layers']} layers, hidden {m['hidden_size']}, heads "
            f"{m['num_attention_heads']}/{m['num_key_value_heads']} (kv), head_dim {m['head_dim']}, vocab "
            f"{m['vocab_size']}, tied={m['tie_word_embeddings']}\n"
            f"  dtype {self.dtype}, kernels {', '.join(f'{b}={k}' for b, k in self.kernels.items())}, "
            f"ids shape {list(self.input_shape)}\n"
            f"  tolerance: max_rel <= {self.tolerance.max_rel:.2e}*g, 1-cos <= "
            f"{self.tolerance.rms_rel**2 / 2:.2e}*g^2, g = sqrt(1 + layers before)"
        )
        if m.get("num_experts"):
            sparse = [i for i in range(self.num_layers) if _is_sparse(m, i)]
            head += (
                f"\n  experts {m['num_experts']} (top-{m['num_experts_per_tok']}"
                f"{', renormalized' if m['norm_topk_prob'] else ''}), sparse layers {sparse}"
            )
        if self.mode == "streamed":
            head += (
                f"\n  streamed one layer at a time; column 'forced': the residual stream and the head with each layer "
                f"given {self.teacher}'s input ('!': outside tolerance)"
            )
        blocks = [head]
        for c in self.comparisons:
            blocks.append(self._table(c))
        blocks.append(self.verdict_line())
        if self.teacher_forced:
            blocks[-1] += "\n" + self.forced_line()
        return "\n\n".join(blocks)

    def _table(self, comparison: Comparison) -> str:
        # Drift columns (each backend against its own float32 run) belong to the cross-backend table only.
        drift = self.drift if comparison is self.comparisons[0] else []
        header = ["component", "max_abs", "mean_abs", "max_rel", "<=", "1-cos", "<=", "KL", "<=", "top1"]
        header += [f"{d.test}~f32" for d in drift] + ["verdict"]
        forced = next((c for c in self.teacher_forced if (c.test, c.ref) == (comparison.test, comparison.ref)), None)
        first = comparison.first_failure
        rows = [_row(r, drift, r is first) for r in comparison.results]
        if forced is not None:  # teacher-forced max_rel before the verdict, "!" outside tolerance
            header.insert(-1, "forced")
            for row, r in zip(rows, comparison.results, strict=True):
                fr = next((x for x in forced.results if x.name == r.name), None)
                shown = fr is not None and fr.metrics is not None
                row.insert(-1, (_num(fr.metrics.max_rel) + ("!" if not fr.passed else " ")) if shown else "")
        title = f"{comparison.label} ({comparison.dtype})"
        if first is not None:
            title += f": FAIL, first at {first.name}: {first.reason}"
        return "\n".join([title, *_align([header, *rows]), *routing_lines(comparison)])

    # ---- JSON -----------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "checkpoint": self.checkpoint,
            "model": self.model,
            "dtype": self.dtype,
            "kernels": self.kernels,
            "reference": self.reference,
            "input_shape": list(self.input_shape),
            "ids": self.ids,
            "passed": self.passed,
            "first_divergence": self.first_divergence,
            "verdict": self.verdict_line(),
            "tolerance": self.tolerance.to_dict(),
            "comparisons": [c.to_dict() for c in self.comparisons],
            "drift": [c.to_dict() for c in self.drift],
            "timings": self.timings,
            "mode": self.mode,
            "teacher": self.teacher,
            "teacher_forced": [c.to_dict() for c in self.teacher_forced],
            "forced_pieces": self.forced_pieces(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def save_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path


def _is_sparse(model: dict, layer: int) -> bool:
    """spec.ModelSpec.is_sparse on the report's model summary (a JSON report has no ModelSpec)."""
    dense = layer in model.get("mlp_only_layers", ()) or (layer + 1) % model.get("decoder_sparse_step", 1)
    return bool(model["num_experts"]) and not dense


def _routing_part(c: Comparison) -> str:
    if not c.routing:
        return ""
    agree = sum(r.agree for r in c.routing) / max(1, sum(r.choices for r in c.routing))
    flips = sum(len(r.near_tie_flips) for r in c.routing)
    return f" (routing {agree:.2%} agree over {len(c.routing)} sparse layers, {flips} near-tie flips)"


def routing_lines(comparison: Comparison, shown: int = 5) -> list[str]:
    """Per sparse layer: the routing agreement, near-ties, failing choices (each named), what was masked."""
    if not comparison.routing:
        return []
    lines = [f"routing ({comparison.label}){': ' + comparison.routing_note if comparison.routing_note else ''}:"]
    for r in comparison.routing:
        lines.append(f"  {r.summary()}")
        for kind, flips in (("near-tie", r.near_tie_flips), ("FAIL", r.failures)):
            for f in flips[:shown]:
                lines.append(f"    {kind}: {f.describe(r.layer, comparison.test, comparison.ref)}")
            if len(flips) > shown:
                lines.append(f"    ... {len(flips) - shown} more {kind} choices")
    if comparison.masked:
        lines.append(
            "  components after a near-tie flip are compared without the flipped token in its layer and without "
            "the later positions of its row in the layers after it (attention carries the flip forward)"
        )
    return lines


def _row(r: ComponentResult, drift: list[Comparison], first: bool) -> list[str]:
    """One table row: metrics and bounds of a component, its drift from float32, its verdict."""
    mt = r.metrics
    shown = mt is not None and mt.finite
    cells = [r.name]
    cells += [_num(mt.max_abs), _num(mt.mean_abs), _num(mt.max_rel)] if shown else ["-"] * 3
    cells += [_num(r.bound.max_rel), _num(max(0.0, 1 - mt.cosine)) if shown else "-", _num(1 - r.bound.min_cosine)]
    if shown and mt.kl_max is not None:  # logits
        cells += [_num(mt.kl_max), _num(r.kl_bound), f"{mt.top1:.3f}"]
    else:
        cells += [""] * 3
    for d in drift:
        dr = next((x for x in d.results if x.name == r.name), None)
        cells.append("" if dr is None or dr.metrics is None else _num(dr.metrics.max_rel))
    cells.append("ok" if r.passed else ("FAIL <- first" if first else "fail"))
    return cells


def _align(rows: list[list[str]]) -> list[str]:
    """Left-align the first column, right-align the others."""
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    return [
        "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.2e}"
