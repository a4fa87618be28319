"""The layer-streamed parity check (`check --stream`): the whole-model check's components, tolerance tables
and report, with each framework holding one piece of the model at a time.

The model is walked in pieces, embed, layer 0 .. L-1, head (final norm and logits), and every run of the
check advances through a piece before the next piece loads: torch and jax at the check's dtype,
transformers with `--reference hf`, and each backend at float32 for the drift baseline. A run builds the piece
from its own classes (torch_impl/layerwise.py, jax_impl/layerwise.py, parity/hf_stream.py), runs it and
drops it, so memory holds one layer's weights (the head's table in layer-sized blocks), the activations at
the layer boundary, and the piece's traces, compared as soon as every run has recorded them and then dropped.

Two modes, both reported. Free-running: each run feeds its own output to its next piece, as the whole-model
check does (error accumulates as in deployment); its comparisons carry the verdict, and on checkpoints where
both fit they give the whole-model check's numbers to float32 noise. Teacher-forced: every run's piece
also gets the teacher's x at that boundary (the teacher is transformers with --reference hf, else torch), so
a piece's own error is measured without what came before: a bug in layer 17 fails in layer 17 only, where
free-running fails in every later layer too. Teacher-forced comparisons localize; they have no verdict, and
are held on what a piece hands on, the residual stream (x1, x2 of each layer) and the head's final norm and
logits: which component inside the piece goes wrong first, free-running's first divergence already names.
A failure while streaming (an unreadable shard) raises: no partial report is returned.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from parity.compare import Comparison, compare_traces
from parity.components import head_components, hf_components, layer_components, residual_stream
from parity.report import Report
from parity.request import KEEP_IDS, Request
from parity.tolerances import tolerance_for
from spec import ModelSpec


@dataclass
class _Lane:
    """One run of the check: a framework at a dtype, its pieces, where its free-running forward stands."""

    label: str  # "torch", "jax", "hf", "torch/float32", "jax/float32": the comparisons' labels
    runner: object  # a Layerwise of torch_impl or jax_impl, or parity.hf_stream.HFLayerwise
    forced: bool  # also run each piece on the teacher's input
    state: object = None  # the free-running boundary after the last piece
    trace: dict = field(default_factory=dict)  # this piece's free-running trace, float32 numpy
    forced_trace: dict = field(default_factory=dict)  # this piece's teacher-forced trace


def _numpy(trace: dict) -> dict[str, np.ndarray]:
    """A piece's trace (torch tensors or JAX arrays, in the run's dtype) as float32 numpy (exact)."""
    out = {}
    for name in list(trace):
        value = trace.pop(name)
        if hasattr(value, "detach"):  # torch
            value = value.detach().float().cpu().numpy()
        out[name] = np.asarray(value).astype(np.float32)  # JAX bfloat16 via ml_dtypes
    return out


class StreamedRun:
    """One streamed check: the runs, the pieces in order, the comparisons filled in piece by piece."""

    def __init__(self, request: Request, progress: bool, say: Callable[[str], None]):
        self.request, self.say = request, say
        self.layers = request.spec.num_hidden_layers
        self.teacher = "hf" if request.reference == "hf" else "torch"
        self.progress = _LayerProgress(self.layers, enabled=progress, say=say)
        self.tolerance = tolerance_for(request.dtype)
        pairs = [("torch", "jax")] + ([("torch", "hf"), ("jax", "hf")] if request.reference == "hf" else [])
        self.free = [Comparison(a, b, request.dtype) for a, b in pairs]
        self.forced = [Comparison(a, b, request.dtype) for a, b in pairs]
        drift = [("torch", "torch/float32"), ("jax", "jax/float32")] if request.baseline else []
        self.drift = [Comparison(a, b, request.dtype) for a, b in drift]
        self.teacher_x: np.ndarray | None = None  # the teacher's x at the boundary before the next piece
        self.handed_on = set(residual_stream(self.layers)) | {"final_norm"}  # what teacher-forced runs compare

    def _lanes(self) -> list[_Lane]:
        import jax_impl.layerwise
        import torch_impl.layerwise

        r = self.request
        make = {
            "torch": lambda dtype, kernels: torch_impl.layerwise.Layerwise(r.directory, dtype, kernels=kernels),
            "jax": lambda dtype, kernels: jax_impl.layerwise.Layerwise(r.directory, dtype, kernels=kernels),
        }
        lanes = [_Lane(b, make[b](r.dtype, r.kernels), b != self.teacher) for b in ("torch", "jax")]
        if r.reference == "hf":
            from parity.hf_stream import HFLayerwise

            lanes.append(_Lane("hf", HFLayerwise(r.directory, r.dtype), False))
        if r.baseline:
            lanes += [_Lane(f"{b}/float32", make[b]("float32", "reference"), False) for b in ("torch", "jax")]
        return lanes

    def _advance(self, lane: _Lane, piece: int | str) -> None:
        """Run `lane` through `piece` ("embed", a layer index, "head"): free-running, and teacher-forced too."""
        runner, first = lane.runner, piece == 0
        if piece == "embed":
            lane.state = runner.embed(self.request.ids, lane.trace)
        else:
            inputs, traces = [lane.state], [lane.trace]
            if lane.forced:
                inputs.append(runner.boundary(self.teacher_x, first_layer=first))
                traces.append(lane.forced_trace)
            if piece == "head":
                runner.head(inputs, traces)
            else:
                lane.state = runner.run_layer(piece, inputs, traces)[0]
        lane.trace = _numpy(lane.trace)
        lane.forced_trace = _numpy(lane.forced_trace) if lane.forced and piece != "embed" else lane.trace

    def _compare(self, names: list[str], lanes: dict[str, _Lane]) -> None:
        hf_names = set(hf_components(self.layers))
        for comparisons, forced in ((self.free, False), (self.forced, True), (self.drift, False)):
            for c in comparisons:
                test, ref = lanes[c.test], lanes[c.ref]
                on = [n for n in names if (c.ref != "hf" or n in hf_names) and (not forced or n in self.handed_on)]
                traces = (test.forced_trace, ref.forced_trace) if forced else (test.trace, ref.trace)
                c.results += compare_traces(
                    *traces, on, num_layers=self.layers, tolerance=self.tolerance, test_label=c.test, ref_label=c.ref
                ).results

    def report(self) -> Report:
        r, start = self.request, time.perf_counter()
        lanes = {lane.label: lane for lane in self._lanes()}
        self.say(
            f"streaming {self.layers} layers one at a time ({', '.join(lanes)}); teacher-forced runs get "
            f"{self.teacher}'s x at every layer boundary"
        )
        pieces: list[int | str] = ["embed", *range(self.layers), "head"]
        try:
            for piece in pieces:
                for lane in lanes.values():
                    lane_start = time.perf_counter()
                    self._advance(lane, piece)
                    self.progress.lane_done(piece, lane.label, time.perf_counter() - lane_start)
                self._compare(_names(piece, self.request.spec), lanes)
                if piece != "head":
                    name = "embed" if piece == "embed" else f"layers.{piece}.x2"
                    self.teacher_x = lanes[self.teacher].trace[name]
                for lane in lanes.values():
                    lane.trace, lane.forced_trace = {}, {}
                _release()
                self.progress.piece_done(piece)
        finally:
            self.progress.close()
        wall = time.perf_counter() - start
        timings = {
            lane.label: {"load_s": round(lane.runner.load_s, 3), "run_s": round(lane.runner.run_s, 3)}
            for lane in lanes.values()
        }
        timings["stream"] = {"wall_s": round(wall, 3), "layers": self.layers, "per_layer_s": self.progress.per_layer()}
        kernels = {b: lanes[b].runner.kernels for b in ("torch", "jax")}
        return Report(
            checkpoint=str(r.directory),
            model=r.spec.to_dict(),
            dtype=r.dtype,
            kernels=kernels,
            reference=r.reference,
            input_shape=tuple(int(n) for n in r.ids.shape),
            tolerance=self.tolerance,
            comparisons=self.free,
            drift=self.drift,
            timings=timings,
            ids=r.ids.tolist() if r.ids.size <= KEEP_IDS else None,
            teacher_forced=self.forced,
            teacher=self.teacher,
            mode="streamed",
        )


def _release() -> None:
    """Hand the dropped piece's memory back to the OS (glibc keeps freed heap pages: parity/trace.py says why).

    A young-generation collection only: a full one takes about half a second with torch, JAX and transformers
    loaded, per piece; the pieces are freed by reference counting, and nothing they hold survives into gen 2."""
    gc.collect(1)
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc (macOS, musl): nothing to trim
        pass


def _names(piece: int | str, spec: ModelSpec) -> list[str]:
    """The components a piece records, in forward order (parity/components.py)."""
    if piece == "embed":
        return ["embed"]
    if piece == "head":
        return head_components(spec)
    return [f"layers.{piece}.{c}" for c in layer_components(spec)]


class _LayerProgress:
    """Per-layer progress on stderr: on a terminal one line, rewritten per run (piece, framework, elapsed,
    estimated remaining); elsewhere (a CI log) one stage line per layer through `say`. Off with -q."""

    def __init__(self, layers: int, *, enabled: bool, say: Callable[[str], None]):
        self.layers, self.enabled, self.say = layers, enabled, say
        self.tty = enabled and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.done = 0  # pieces finished, of layers + 2
        self.layer_s: list[float] = []
        self._piece_start = self.start
        self._lanes: list[str] = []

    def _eta(self, fraction: float) -> str:
        elapsed = time.perf_counter() - self.start
        left = elapsed / fraction * (1 - fraction) if fraction > 0 else float("nan")
        return f"elapsed {_clock(elapsed)}, ~{_clock(left)} left"

    def lane_done(self, piece: int | str, label: str, seconds: float) -> None:
        self._lanes.append(f"{label} {seconds:.1f}s")
        if self.tty:
            where = f"layer {piece + 1}/{self.layers}" if isinstance(piece, int) else piece
            line = (
                f"[decoder-parity] {where} {label}: {seconds:.1f}s; {self._eta((self.done + 0.5) / (self.layers + 2))}"
            )
            sys.stderr.write(f"\r{line}\033[K")
            sys.stderr.flush()

    def piece_done(self, piece: int | str) -> None:
        now = time.perf_counter()
        if isinstance(piece, int):
            self.layer_s.append(now - self._piece_start)
        self.done += 1
        if self.enabled and not self.tty and isinstance(piece, int):
            fraction = self.done / (self.layers + 2)
            self.say(f"layer {piece + 1}/{self.layers} ({', '.join(self._lanes)}); {self._eta(fraction)}")
        self._piece_start, self._lanes = now, []

    def per_layer(self) -> float:
        return round(float(np.mean(self.layer_s)), 3) if self.layer_s else 0.0

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _clock(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"
