"""kernels/cpu/gemm_upcast_rows.c (gemm.c's bfloat16-storage, float32-compute loops on nn.Linear's layout) through
its torch launcher (torch_gemm.upcast): against its float64 reference (reference.py, "rows") at shapes that leave a
tail in every loop; bit for bit jax_impl's `upcast` (the same loops on Flax's layout) on the transposed weight; which
processors build it (kernels/cpu/build.py's ISA). What it shares with torch_gemm's AMX product (its rounding, an
output's independence of place and threads, the FLOP counter, bad operands, a model's prompt on it) is tested for
both in test_cpu_gemm_rows.py.

The float32 sum is held to the float32 table's bound (reordered float32 sums; parity/tolerances.py): a bf16 product
is exact in float32, so the only error is the order of the float32 sum."""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch

from kernels.cpu import build, torch_gemm
from kernels.cpu.reference import gemv_reference
from parity.tolerances import TOLERANCES
from tests.kernels.test_cpu_gemm_rows import operands

MAX_REL = TOLERANCES["float32"].max_rel
WHY_NOT = build._unsupported(torch_gemm.UPCAST_LIBRARY)  # x86-64 with AVX-512 (not every CI machine), a compiler
needs_kernel = pytest.mark.skipif(WHY_NOT is not None, reason=f"not buildable here: {WHY_NOT}")
# (rows, in, out): gemm.c's register tiles of 12 rows, row blocks of 192, K blocks of 256, panels of 32 columns in
# two halves of 16, and here W's rows gathered two k at a time (an odd `in` leaves one k alone)
ODD_SHAPES = [(9, 1, 1), (11, 7, 5), (12, 255, 16), (13, 257, 17), (25, 300, 33), (32, 64, 32), (193, 513, 67),
              (400, 64, 100), (64, 600, 1100), (9, 1025, 65), (197, 1023, 130)]  # fmt: skip


def rel(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> float:
    as_f32 = lambda t: None if t is None else t.float().numpy()  # noqa: E731 (bf16 widens exactly)
    want = gemv_reference(as_f32(x), as_f32(w), as_f32(b), "rows")
    return float(np.abs(got.double().numpy() - want).max() / max(np.abs(want).max(), 1e-30))


def test_the_kernel_builds_where_the_processor_has_avx512():
    """Where the processor has AVX-512F the library builds (a broken source fails here instead of torch_impl quietly
    keeping the libraries' paths); elsewhere `supports_upcast` is False."""
    if WHY_NOT is not None:
        assert not torch_gemm.supports_upcast(*operands(16, 32, 32))
        return
    assert torch_gemm.upcast_available(), build.unavailable(torch_gemm.UPCAST_LIBRARY)


def test_processors_without_avx512_get_a_reason(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # an AVX2 machine (AMD EPYC here)
    assert build._unsupported(torch_gemm.UPCAST_LIBRARY) == "the processor lacks avx512f"
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f"}))
    assert build._unsupported(torch_gemm.UPCAST_LIBRARY) is None


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("rows", "in_", "out"), ODD_SHAPES)
def test_matches_float64_product(rows, in_, out, bias):
    x, w, b = operands(rows, in_, out, bias=bias)
    got = torch_gemm.upcast(x, w, b, out_dtype=torch.float32)
    assert got.shape == (rows, out) and got.dtype == torch.float32
    assert rel(got, x, w, b) <= MAX_REL


@needs_kernel
@pytest.mark.parametrize(("rows", "in_", "out"), ODD_SHAPES[::2])
def test_bit_for_bit_jax_impls_upcast_on_the_transposed_weight(rows, in_, out):
    """Only the packing differs between the two layouts (gathered rows here, 64-byte runs of W's rows there): every
    sum is the same chain of multiply-adds, so the float32 results agree bit for bit."""
    jax_gemm = pytest.importorskip("kernels.cpu.jax_gemm")
    if not jax_gemm.upcast_available():
        pytest.skip("jax_impl's upcast is not built here")
    import jax
    import jax.numpy as jnp

    x, w, _ = operands(rows, in_, out, seed=4)
    got = torch_gemm.upcast(x, w, out_dtype=torch.float32).numpy()
    as_jax = lambda t: jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)  # noqa: E731 (exact: bf16 values)
    twin = np.asarray(jax.jit(jax_gemm.upcast)(as_jax(x), as_jax(w.T.contiguous())))  # W [in, out]: Flax's layout
    np.testing.assert_array_equal(got, twin)


def test_in_features_past_the_gathers_reach_are_refused():
    """gemm.c gathers W's rows at int32 offsets up to 15 * in: wider rows are not the kernel's. x is an expanded view
    (no memory) and W is never written (its pages are never touched): the shapes are refused before any is read."""
    wide = torch_gemm.UPCAST_MAX_IN + 1
    x = torch.zeros(1, 1, dtype=torch.bfloat16).expand(torch_gemm.MIN_ROWS, wide)
    w = torch.empty(1, wide, dtype=torch.bfloat16)  # [1, in], contiguous
    assert not torch_gemm.supports_upcast(x, w, None)
    at_most = torch.empty(1, wide - 1, dtype=torch.bfloat16)
    assert torch_gemm.supports_upcast(x[:, :-1], at_most, None) is torch_gemm.upcast_available()
    with pytest.raises(ValueError, match=rf"upcast: x \({torch_gemm.MIN_ROWS}, {wide}\).* in <= {wide - 1},"):
        torch_gemm.upcast(x, w)
