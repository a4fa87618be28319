"""kernels/cpu: the few-row product's instruction-set levels (gemv.c's AVX2 loops, gemv_avx512.c's AVX-512F and
AVX512_BF16 loops), each called directly at every level the processor has (`gemv_*_part_at`), against the float64
reference and against each other: the cols layout bit for bit the same at every level, the rows layout's two bf16
loops (fused multiply-adds, VDPBF16PS) bit for bit the same, and every level's result independent of the cut.

On a processor without AVX-512 only level 0 runs here (the higher levels are skipped, naming the missing flag); CI's
machines come up as either kind, and test_cpu_gemv.py holds the launchers to the reference at whatever level the
processor picks.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

from kernels.cpu import build
from kernels.cpu.reference import gemv_reference
from parity.tolerances import TOLERANCES

MAX_REL = TOLERANCES["float32"].max_rel  # float32 sums in another order (test_cpu_gemv.py's bound)
LEVELS = {0: "avx2", 1: "avx512f", 2: "avx512_bf16"}  # gemv.c's ISA_* levels and the /proc/cpuinfo flag each needs
SHAPES = [(37, 53), (300, 1061), (1061, 300), (2048, 1031)]  # (in, out): tails past 32, 16 and 8 in every loop
_P, _L = ctypes.c_void_p, ctypes.c_long


@pytest.fixture(scope="module")
def lib():
    lib = build.load("gemv")
    if lib is None:
        pytest.skip(f"kernel not built here: {build.unavailable('gemv')}")
    lib.gemv_isa.restype = _L
    for name in ("rows_f32", "rows_bf16"):
        getattr(lib, f"gemv_{name}_part_at").argtypes = [_P, _P, _P, _P, _L, _L, _L, _L, _L, _L, _L]
    for name in ("cols_f32", "cols_bf16"):
        getattr(lib, f"gemv_{name}_part_at").argtypes = [_P, _P, _P, _L, _L, _L, _L, _L, _L, _L]
    lib.gemv_cols_reduce_part.argtypes = [_P, _P, _P, _L, _L, _L, _L, _L]
    lib.gemv_cols_chunks.argtypes, lib.gemv_cols_chunks.restype = [_L], _L
    return lib


def _level(lib, level: int) -> None:
    if level > lib.gemv_isa():
        pytest.skip(f"the processor lacks {LEVELS[level]}")


def _ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data_as(_P)


def product(lib, x: np.ndarray, w: np.ndarray, layout: str, level: int, parts: int = 1, fetch: int = 1) -> np.ndarray:
    """x [m, in] float32 @ w ([out, in] rows, [in, out] cols; float32 or bfloat16) at `level`, cut into `parts`, its
    streams fetching ahead in software or not (`fetch`, gemv.h)."""
    m, in_ = x.shape
    out = w.shape[0] if layout == "rows" else w.shape[1]
    kind = f"{layout}_{'bf16' if w.dtype == ml_dtypes.bfloat16 else 'f32'}"
    fn = getattr(lib, f"gemv_{kind}_part_at")
    y = np.zeros((m, out), np.float32)
    if layout == "rows":
        for part in range(parts):
            fn(_ptr(x), _ptr(w), None, _ptr(y), m, in_, out, part, parts, fetch, level)
        return y
    partials = np.zeros((lib.gemv_cols_chunks(in_), m, out), np.float32)
    for part in range(parts):
        fn(_ptr(x), _ptr(w), _ptr(partials), m, in_, out, part, parts, fetch, level)
    for part in range(parts):
        lib.gemv_cols_reduce_part(_ptr(partials), None, _ptr(y), m, in_, out, part, parts)
    return y


def operands(m: int, in_: int, out: int, layout: str, bf16: bool, seed: int = 0):
    gen = np.random.default_rng(seed)
    x = gen.standard_normal((m, in_)).astype(np.float32)
    w = gen.standard_normal((out, in_) if layout == "rows" else (in_, out)).astype(np.float32)
    if bf16:  # a bf16 model's activations are bf16 values too: the rows kernel's VDPBF16PS path takes them
        x, w = x.astype(ml_dtypes.bfloat16).astype(np.float32), w.astype(ml_dtypes.bfloat16)
    return x, w


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def test_the_level_is_the_processors(lib):
    flags = build.cpu_flags()
    want = 2 if {"avx512f", "avx512_bf16"} <= flags else 1 if "avx512f" in flags else 0
    assert lib.gemv_isa() == want, (lib.gemv_isa(), sorted(f for f in flags if f.startswith("avx512")))


@pytest.mark.parametrize("in_", [1, 255, 256, 511, 1024, 2048, 3072, 4096, 8192, 14336, 100_000])
def test_a_cols_chunk_is_at_least_256_rows_and_there_are_at_most_16(lib, in_):
    # gemv.c: a chunk's own work (zeroing its partial, adding it in the reduction) stays small against its rows, and
    # the most threads a cols product can use grows with its input up to 16
    chunks = lib.gemv_cols_chunks(in_)
    assert 1 <= chunks <= 16
    assert chunks == 1 or in_ // chunks >= 256
    assert chunks == 16 or in_ // (chunks + 1) < 256  # no fewer than the rule allows


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("layout", ["rows", "cols"])
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize(("in_", "out"), SHAPES)
def test_each_level_matches_float64_and_its_cut(lib, level, layout, bf16, in_, out):
    _level(lib, level)
    x, w = operands(3, in_, out, layout, bf16)
    got = product(lib, x, w, layout, level)
    assert rel(got, gemv_reference(x, w, None, layout)) <= MAX_REL
    assert np.array_equal(product(lib, x, w, layout, level, parts=3), got)  # no output's order depends on the cut


@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("bf16", [False, True])
def test_cols_are_the_avx2_loops_bit_for_bit(lib, level, bf16):
    _level(lib, level)
    for in_, out in SHAPES:
        x, w = operands(2, in_, out, "cols", bf16)
        assert np.array_equal(product(lib, x, w, "cols", level), product(lib, x, w, "cols", 0)), (in_, out)


def test_rows_bf16_dot_instruction_is_the_fused_loop_bit_for_bit(lib):
    """VDPBF16PS (level 2, x holding bf16 values) adds each lane's odd product, then its even one: the level-1 loop's
    order, so the two agree bit for bit; an x that is not bf16 values takes the level-1 loop at level 2 too."""
    _level(lib, 2)
    for in_, out in SHAPES:
        x, w = operands(4, in_, out, "rows", True)
        assert np.array_equal(product(lib, x, w, "rows", 2), product(lib, x, w, "rows", 1)), (in_, out)
        x[1, 5] = np.float32(1.0 + 2.0**-20)  # one float32 that is no bf16
        assert np.array_equal(product(lib, x, w, "rows", 2), product(lib, x, w, "rows", 1)), (in_, out)
        want = gemv_reference(x, w, None, "rows")
        assert rel(product(lib, x, w, "rows", 2), want) <= MAX_REL  # the float32 x taken as it is, not rounded


@pytest.mark.parametrize(("m", "in_"), [(1, 4160), (1, 16416), (8, 2048), (8, 4160)])
def test_rows_bf16_dot_with_x_converted_once_or_as_read(lib, m, in_):
    """x's pairs are made once per call where they fit gemv_avx512.c's stack buffer (32 KB: m x in / 32 blocks of 64
    bytes; here 130, 513 past the buffer, 512 at its edge and 1040 past it) and as the loop reads them otherwise:
    the same pairs, so both are the level-1 loop's bits, and each independent of the cut."""
    _level(lib, 2)
    x, w = operands(m, in_, 37, "rows", True)
    got = product(lib, x, w, "rows", 2)
    assert np.array_equal(got, product(lib, x, w, "rows", 1))
    assert np.array_equal(product(lib, x, w, "rows", 2, parts=3), got)
    assert rel(got, gemv_reference(x, w, None, "rows")) <= MAX_REL


def test_a_level_above_the_processors_runs_the_processors(lib):
    x, w = operands(2, 300, 1061, "rows", True)
    top = lib.gemv_isa()
    assert np.array_equal(product(lib, x, w, "rows", 7), product(lib, x, w, "rows", top))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("layout", ["rows", "cols"])
@pytest.mark.parametrize("bf16", [False, True])
def test_the_software_fetch_changes_no_bit(lib, level, layout, bf16):
    _level(lib, level)  # kernels/cpu/gemv_fetch.py chooses it by speed alone
    for in_, out in SHAPES:
        x, w = operands(2, in_, out, layout, bf16, seed=1)
        ahead, hardware = product(lib, x, w, layout, level, fetch=1), product(lib, x, w, layout, level, fetch=0)
        assert np.array_equal(ahead, hardware), (in_, out)
        assert rel(hardware, gemv_reference(x, w, None, layout)) <= MAX_REL
