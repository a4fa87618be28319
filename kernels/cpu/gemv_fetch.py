"""Whether the CPU product kernel's weight streams fetch their lines ahead in software (kernels/cpu/gemv.c's `fetch`),
chosen by measurement on the machine that runs it: `fetch(dtype, layout)` -> 1 (each of a part's four streams asks
for its line a fixed distance ahead of reading it) or 0 (the processor's own prefetchers alone).

The software fetch changes no result, only how fast a weight streams from memory, and the processors measured so far
rank the two in opposite orders (docs/benchmarks.md): on one the hardware's prefetchers alone left the streams short
of the machine's bandwidth, on another the fetch held them below what the hardware's prefetchers read. So neither is
fixed: the first product of a (dtype, layout) times both on a weight larger than a core's caches, taken out of
every cache level before each pass (kernels/cpu/evict.py), in rounds (spec/path_choice.py), and the choice holds for
the process. Every launcher of the kernel asks here (torch_gemv, torch_decode_layer, jax_gemv, jax_decode_layer), so
a decode step's products and the probe's read of the machine's bandwidth (benchmarks/bandwidth.py) stream the same way.

The measurement calls the kernel's OpenMP driver through ctypes (the "gemv" library), in whichever backend asks: the
choice is the memory system's, not the driver's. `FETCH.forced("hardware")` pins one for a block (tests, comparisons).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from kernels.cpu import build, evict
from spec.path_choice import Pass, PathChoice

# "ahead" first: the form the kernel had, kept unless the hardware's own fetch is faster by the median of the rounds'
# paired ratios (a few percent apart: the "every round" rule would leave it to the rounds' noise)
FETCH = PathChoice("kernels.cpu.gemv_fetch", ("ahead", "hardware"), repeats=8, margin=0.01, rule="median")
CODES = {"ahead": 1, "hardware": 0}  # gemv.h's `fetch`
DTYPES = ("float32", "bfloat16")
LAYOUTS = ("rows", "cols")
PASS_BYTES = 32 << 20  # the timed weight: past any core's own caches, read from memory after each eviction
PASS_IN = 2048  # their contraction width (decode-step-like: 1024-4096 in the models this project runs)
_P, _L = ctypes.c_void_p, ctypes.c_long


@functools.cache
def drivers() -> dict[tuple[str, str], ctypes._CFuncPtr] | None:
    """The kernel's whole-product OpenMP drivers (gemv.h's gemv_LAYOUT_T) per (dtype, layout), for ctypes calls
    (x, w, b, y, m, in, out, fetch); None where the "gemv" library cannot be loaded here."""
    argtypes = [_P, _P, _P, _P, _L, _L, _L, _L]  # x, w, b, y, m, in, out, fetch
    names = {
        (dtype, layout): (f"gemv_{layout}_{'f32' if dtype == 'float32' else 'bf16'}", argtypes)
        for dtype in DTYPES
        for layout in LAYOUTS
    }
    return build.functions("gemv", names)


def fetch(dtype: str, layout: str) -> int:
    """gemv.h's `fetch` for a product of `dtype` ("float32" or "bfloat16") weights in `layout` ("rows" or "cols"):
    the form chosen for the process, measured at the first ask of each pair (or the forced one). Where the kernel or
    eviction does not run here, no measurement can be made and the fetch the kernel had stays (1)."""
    if dtype not in DTYPES or layout not in LAYOUTS:
        raise ValueError(f"gemv_fetch: dtype {dtype!r} (one of {DTYPES}) and layout {layout!r} (one of {LAYOUTS})")
    if drivers() is None or not evict.available():  # settle and choose both give a forced form first
        return CODES[FETCH.settle((dtype, layout), "ahead")]
    return CODES[FETCH.choose((dtype, layout), lambda: _passes(dtype, layout))]


def _passes(dtype: str, layout: str) -> dict[str, Pass]:
    """One timed pass per form over one weight of PASS_BYTES, evicted before it. Each form runs twice from memory
    first, untimed: the first passes after the weight is mapped ran several times slower than the rest."""
    size = 4 if dtype == "float32" else 2
    width = PASS_BYTES // (size * PASS_IN)
    shape = (PASS_IN, width) if layout == "cols" else (width, PASS_IN)  # [in, out] or [out, in]
    one = (np.uint16(0x3F80), np.uint16) if size == 2 else (np.float32(1.0), np.float32)  # 1.0: every page written
    weight = np.full(shape, *one)
    x = np.ones((1, PASS_IN), np.float32)
    y = np.empty((1, width), np.float32)
    run, evicting = drivers()[(dtype, layout)], evict.evicting([(weight.ctypes.data, weight.nbytes)])

    def form(code: int) -> Pass:
        def timed() -> None:
            run(x.ctypes.data, weight.ctypes.data, None, y.ctypes.data, 1, PASS_IN, width, code)

        return Pass(timed, evicting)

    forms = {name: form(code) for name, code in CODES.items()}
    for _ in range(2):
        for f in forms.values():
            f.evict()
            f.run()
    return forms
