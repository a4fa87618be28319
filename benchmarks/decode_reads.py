"""The weight-streaming limit asked in a decode step's own shapes: a step's products alone, each layout, against the
limit's 1 GiB read on the same kernel.

benchmarks/cpu_decode.py sets each backend's decode against the weight-streaming limit: the read rate of one 1 GiB
float32 product (the best of its readers, the project's CPU product kernel among them: benchmarks/bandwidth.py) over
the bytes a token reads. A step
does not read one stream, though: it reads every layer's q, k, v, o, gate_up and down (1-25 MB each in Qwen3-0.6B),
then the head, each product ending at a barrier. This script times exactly those products and nothing else (no
attention, norms or dispatch), on the same kernel's OpenMP driver (kernels/cpu/gemv.c) with the software fetch the
backends' launchers choose (kernels/cpu/gemv_fetch.py), in three arms over one buffer of the step's bytes:

    rows  every product in the rows layout, [out, in]: torch's weights, and the loop the head takes in both backends
    cols  the layers' products in the cols layout, [in, out] (Flax's kernels, as jax_impl's decode layer call reads
          them); the head in rows, as both backends take it
    one   the whole buffer as one product of hidden-wide rows: the step's bytes in a single stream

With `--fetch both` the rows and cols arms run twice, each with the fetch forced one way (rows/ahead, rows/hardware,
cols/ahead, cols/hardware): whether the choice gemv_fetch.py makes on its one 32 MB pass holds in the step's shapes.

Every arm reads the same buffer (the layers' weights carved out of it in the order a step reads them: the favourable
case, a loader's tensors lie apart), each right after the limit's own 1 GiB read, the arms' order rotating round by
round. These VMs' read rate moves between states within seconds (docs/benchmarks.md), so the rounds are split into
thirds by the reading taken just before them and each third gives each arm's median rate over that reading: what a
layer-by-layer decode could reach at most, state by state, on this machine.

    python benchmarks/decode_reads.py [--dtype bfloat16] [--rounds 200] [--shape qwen3-0.6b] [--fetch both]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.machine import describe, line  # noqa: E402
from benchmarks.qwen3_shape import SHAPES  # noqa: E402
from spec import ModelSpec  # noqa: E402

ARMS = ("rows", "cols", "one")  # with --fetch both: FETCHED_ARMS
FETCHED_ARMS = ("rows/ahead", "rows/hardware", "cols/ahead", "cols/hardware", "one")
SIZES = {"float32": 4, "bfloat16": 2}


def step_products(spec: ModelSpec) -> list[tuple[str, int, int]]:
    """(name, out, in) of every product a decode step of a dense model reads, in the order it reads them: each
    layer's q, k, v, o, gate_up, down, then the head."""
    if spec.num_experts:
        raise ValueError(f"decode_reads: a dense model's step only; {spec.model_type} has {spec.num_experts} experts")
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    nq, nk = spec.num_attention_heads * d, spec.num_key_value_heads * d
    layer = [("q", nq, h), ("k", nk, h), ("v", nk, h), ("o", h, nq), ("gate_up", 2 * inter, h), ("down", h, inter)]
    return [(f"{i}.{name}", out, n_in) for i in range(spec.num_hidden_layers) for name, out, n_in in layer] + [
        ("head", spec.vocab_size, h)
    ]


class Reads:
    """The arms and the limit's read, set up once: one buffer of the step's bytes, the products carved out of it."""

    def __init__(self, spec: ModelSpec, dtype: str, reading_bytes: int):
        from kernels.cpu import gemv_fetch

        self.kernels, self.hidden, self.codes = gemv_fetch.drivers(), spec.hidden_size, gemv_fetch.CODES
        self.products = step_products(spec)
        elements = sum(out * n_in for _, out, n_in in self.products)
        one = (np.uint16(0x3F80), np.uint16) if dtype == "bfloat16" else (np.float32(1.0), np.float32)
        self.buffer = np.full(elements, *one)  # 1.0 everywhere: every page written, nothing overflows
        self.step_bytes = self.buffer.nbytes
        self.one_rows = elements // self.hidden  # the "one" arm's [one_rows, hidden] product
        self.one_bytes = self.one_rows * self.hidden * self.buffer.itemsize
        side = max(1, int((reading_bytes // 4) ** 0.5))
        self.reading = np.ones((side, side), np.float32)  # [out, in]: the limit's read, float32 rows
        widest = max(side, self.one_rows, *(max(out, n_in) for _, out, n_in in self.products))
        self.x, self.y = np.ones(widest, np.float32), np.empty(widest, np.float32)  # every product's x and y fit
        self.dtype = dtype
        self.fetch = {layout: gemv_fetch.fetch(dtype, layout) for layout in ("rows", "cols")}
        self.reading_fetch = gemv_fetch.fetch("float32", "rows")

    def _product(self, layout: str, offset: int, out: int, n_in: int, fetch: int) -> None:
        run = self.kernels[(self.dtype, layout)]
        w = self.buffer.ctypes.data + offset * self.buffer.itemsize
        run(self.x.ctypes.data, w, None, self.y.ctypes.data, 1, n_in, out, fetch)

    def arm(self, name: str) -> float:
        """One pass of arm `name` (ARMS, FETCHED_ARMS) over the step's bytes: its read rate, bytes/s."""
        layout, _, form = name.partition("/")  # a forced fetch after the slash, else each layout's chosen one
        fetch = {key: self.codes[form] for key in self.fetch} if form else self.fetch
        start = time.perf_counter()
        if layout == "one":
            self._product("rows", 0, self.one_rows, self.hidden, fetch["rows"])
        else:
            offset = 0
            for product, out, n_in in self.products:
                kind = "rows" if layout == "rows" or product == "head" else "cols"
                self._product(kind, offset, out, n_in, fetch[kind])
                offset += out * n_in
        seconds = time.perf_counter() - start
        return (self.one_bytes if layout == "one" else self.step_bytes) / seconds

    def read_rate(self) -> float:
        """The limit's read: one float32 product over the reading matrix, bytes/s."""
        side = self.reading.shape[0]
        start = time.perf_counter()
        self.kernels[("float32", "rows")](
            self.x.ctypes.data, self.reading.ctypes.data, None, self.y.ctypes.data, 1, side, side, self.reading_fetch
        )
        return self.reading.nbytes / (time.perf_counter() - start)


def measure(reads: Reads, rounds: int, arms: tuple[str, ...] = ARMS) -> list[dict]:
    """`rounds` rounds of every arm, each right after a reading, the arms' order rotating: one record per arm run."""
    for name in arms:  # warm-up: the first passes after the pages are mapped run slower
        reads.read_rate()
        reads.arm(name)
    records = []
    for r in range(rounds):
        for name in arms[r % len(arms) :] + arms[: r % len(arms)]:
            reading = reads.read_rate()
            records.append({"round": r, "arm": name, "reading": reading, "rate": reads.arm(name)})
    return records


def by_state(records: list[dict]) -> list[dict]:
    """The records split into thirds by their reading (the machine's read-rate states, low to high): per third its
    readings' range and, per arm (in the order the records first name them), the median of rate / reading and of
    the rate, with the count."""
    names = list(dict.fromkeys(r["arm"] for r in records))
    readings = sorted(r["reading"] for r in records)
    cuts = [readings[len(readings) // 3], readings[2 * len(readings) // 3]]
    thirds = []
    for lo, hi, label in ((None, cuts[0], "low"), (cuts[0], cuts[1], "middle"), (cuts[1], None, "high")):
        inside = [r for r in records if (lo is None or r["reading"] >= lo) and (hi is None or r["reading"] < hi)]
        arms = {}
        for name in names:
            mine = [r for r in inside if r["arm"] == name]
            if mine:
                arms[name] = {
                    "ratio": statistics.median(r["rate"] / r["reading"] for r in mine),
                    "gb_s": statistics.median(r["rate"] for r in mine) / 1e9,
                    "runs": len(mine),
                }
        if inside:
            span = [min(r["reading"] for r in inside) / 1e9, max(r["reading"] for r in inside) / 1e9]
            thirds.append({"state": label, "reading_gb_s": span, "arms": arms})
    return thirds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=tuple(SIZES), default="bfloat16")
    parser.add_argument("--rounds", type=int, default=200, help="rounds of the arms (at least 3)")
    parser.add_argument("--shape", choices=sorted(s for s, spec in SHAPES.items() if not spec.num_experts),
                        default="qwen3-0.6b")  # fmt: skip
    parser.add_argument("--layers", type=int, default=None, help="the shape's first LAYERS layers only")
    parser.add_argument("--reading-mb", type=int, default=1024, help="the limit's read, MiB (bandwidth.py: 1024)")
    parser.add_argument("--fetch", choices=("chosen", "both"), default="chosen",
                        help="both: the rows and cols arms once with each fetch forced")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    spec = SHAPES[args.shape]
    if args.rounds < 3 or args.reading_mb < 1 or (args.layers is not None and not 1 <= args.layers):
        parser.error("--rounds must be at least 3 (three states), --reading-mb and --layers at least 1")
    if args.layers is not None:
        spec = dataclasses.replace(spec, num_hidden_layers=min(args.layers, spec.num_hidden_layers))
    from kernels.cpu import build, gemv_fetch

    if gemv_fetch.drivers() is None:
        print(f"decode_reads: the CPU product kernel does not run here: {build.unavailable('gemv')}", file=sys.stderr)
        return 1
    print(line())
    reads = Reads(spec, args.dtype, args.reading_mb << 20)
    print(
        f"{args.shape} ({spec.num_hidden_layers} layers), {args.dtype}: a step's products {reads.step_bytes / 1e9:.3f}"
        f" GB; the limit's read {reads.reading.nbytes / 2**20:.0f} MiB float32; fetch rows {reads.fetch['rows']}, "
        f"cols {reads.fetch['cols']}; {args.rounds} rounds",
        flush=True,
    )
    arms = FETCHED_ARMS if args.fetch == "both" else ARMS
    thirds = by_state(measure(reads, args.rounds, arms))
    for third in thirds:
        lo, hi = third["reading_gb_s"]
        cells = "; ".join(
            f"{name} {a['gb_s']:.1f} GB/s, x{a['ratio']:.3f} of its reading ({a['runs']})"
            for name, a in third["arms"].items()
        )
        print(f"  {third['state']:6s} readings {lo:5.1f}-{hi:5.1f} GB/s: {cells}")
    if args.json is not None:
        figures = {
            "machine": describe(), "shape": args.shape, "layers": spec.num_hidden_layers, "dtype": args.dtype,
            "step_bytes": reads.step_bytes, "fetch": reads.fetch, "arms": arms, "rounds": args.rounds, "states": thirds,
        }  # fmt: skip
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
