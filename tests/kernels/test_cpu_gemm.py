"""kernels/cpu/gemm.c and gemm_amx.c: the many-row float32 (AVX-512) and bfloat16 (AMX) products through their JAX
launcher (jax_gemm.py) against their float64 reference (reference.py), at shapes that leave a tail in every loop
(gemm.c: row tiles of 12, row blocks of 192, panels of 32 columns, K blocks of 256; gemm_amx.c: blocks of 32 rows,
32 columns and 32 k, groups of 16 panels, K blocks of 256, the padded copies of x and y); that a float32 output's sum
does not depend on where its row falls; bad operands refused by name; and which processors build them
(kernels/cpu/build.py's ISA).

The bound is the float32 table's (reordered float32 sums; parity/tolerances.py) for both: a bf16 product is exact in
float32 and each kernel returns the float32 sum unrounded."""

from __future__ import annotations

import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.cpu import build
from kernels.cpu.reference import gemv_reference
from parity.tolerances import TOLERANCES

MAX_REL = TOLERANCES["float32"].max_rel
CAN_BUILD = build._unsupported("gemm_xla") is None  # x86-64 with AVX-512 (not every CI machine) and a compiler
CAN_BUILD_AMX = build._unsupported("gemm_amx_xla") is None  # ... with AMX (Sapphire Rapids and later)
needs_kernel = pytest.mark.skipif(not CAN_BUILD, reason=f"not buildable here: {build._unsupported('gemm_xla')}")
DTYPES = [
    "float32",
    pytest.param("bfloat16", marks=pytest.mark.skipif(not CAN_BUILD_AMX, reason="no AMX here")),
]


def rel(got: jax.Array, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def operands(rows: int, in_: int, out: int, seed: int = 0, dtype: str = "float32") -> tuple[jax.Array, jax.Array]:
    gen = np.random.default_rng(seed)
    x = jnp.asarray(gen.standard_normal((rows, in_)), dtype)
    w = jnp.asarray(gen.standard_normal((in_, out)), dtype)  # [in, out]: Flax's kernel layout
    return x, w


@pytest.mark.parametrize(
    ("dtype", "buildable", "flag"), [("float32", CAN_BUILD, "avx512f"), ("bfloat16", CAN_BUILD_AMX, "amx")]
)
def test_the_kernels_build_where_the_processor_has_their_instructions(dtype, buildable, flag):
    """Where the processor has what a library is compiled for, it builds and registers (a broken source fails here
    instead of jax_impl quietly keeping XLA's dot); elsewhere the reason names what is missing."""
    from kernels.cpu import jax_gemm

    library = jax_gemm.LIBRARIES[dtype][0]
    if not buildable:
        assert flag in build._unsupported(library) or build._unsupported() is not None
        return
    assert jax_gemm.available(dtype), jax_gemm.unavailable(dtype)


def test_processors_without_avx512_get_a_reason(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert build._unsupported("gemm_xla") == "the processor lacks avx512f"
    assert build._unsupported("gemm_amx_xla") == "the processor lacks avx512f, avx512bw, amx_tile, amx_bf16"
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f", "avx512bw"}))
    assert build._unsupported("gemm_amx_xla") == "the processor lacks amx_tile, amx_bf16"  # AVX-512 without AMX
    assert "avx512f" not in (build._unsupported("gemv_xla") or "")  # the AVX2 kernels ask for no more


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "in_", "out"),
    [(1, 1, 1), (11, 7, 5), (12, 255, 16), (13, 257, 17), (25, 300, 33), (32, 64, 32), (193, 513, 67),
     (400, 64, 100), (64, 600, 1100)],
)  # fmt: skip
def test_matches_float64_product(dtype, rows, in_, out):
    from kernels.cpu import jax_gemm

    x, w = operands(rows, in_, out, dtype=dtype)
    got = jax.jit(jax_gemm.gemm)(x, w)
    assert got.shape == (rows, out) and got.dtype == jnp.float32
    assert rel(got, gemv_reference(np.asarray(x), np.asarray(w), None, "cols")) <= MAX_REL


@needs_kernel
def test_a_rows_sum_does_not_depend_on_its_place():
    """Each output is one chain of fused multiply-adds in k order, whatever row tile, row block or thread computes
    it: a row's result is bit for bit the same in a product of 401 rows (three row blocks, a short last tile) as
    alone."""
    from kernels.cpu import jax_gemm

    x, w = operands(401, 600, 70, seed=1)
    whole = np.asarray(jax.jit(jax_gemm.gemm)(x, w))
    for row in (0, 11, 12, 191, 192, 400):
        alone = np.asarray(jax.jit(jax_gemm.gemm)(x[row : row + 1], w))
        np.testing.assert_array_equal(whole[row : row + 1], alone)


@needs_kernel
def test_bad_operands_are_refused_by_name():
    from kernels.cpu import jax_gemm

    x, w = operands(16, 40, 24)
    with pytest.raises(ValueError, match=r"gemm: x \(16, 40\) float32, w \(24, 40\) float32"):
        jax_gemm.gemm(x, w.T)  # W [out, in]: not the kernel's layout
    with pytest.raises(ValueError, match="bfloat16"):
        jax_gemm.gemm(x, w.astype(jnp.bfloat16))  # mixed dtypes
    with pytest.raises(ValueError, match="float16"):
        jax_gemm.gemm(x.astype(jnp.float16), w.astype(jnp.float16))  # no kernel for it
    with pytest.raises(ValueError, match=r"x \(16, 0\)"):
        jax_gemm.gemm(x[:, :0], w[:0])
