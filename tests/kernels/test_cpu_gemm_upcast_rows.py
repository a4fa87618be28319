"""kernels/cpu/gemm_upcast_rows.c (gemm.c's bfloat16-storage, float32-compute loops on nn.Linear's layout) through
its torch launcher (torch_gemm.upcast): against its float64 reference (reference.py, "rows") at shapes that leave a
tail in every loop; bit for bit jax_impl's `upcast` (the same loops on Flax's layout) on the transposed weight; its
bf16 result the float32 sum plus the bias, rounded once as torch rounds; an output's sum independent of its place
and of the number of threads; bad operands refused by name; which processors build it (kernels/cpu/build.py's ISA).

The float32 sum is held to the float32 table's bound (reordered float32 sums; parity/tolerances.py): a bf16 product
is exact in float32, so the only error is the order of the float32 sum. A bf16 model's prompt with every product on
the kernel is held to the bf16 table's bound against the same prompt on F.linear."""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch

import torch_impl
from kernels.cpu import build, torch_gemm
from kernels.cpu.reference import gemv_reference
from parity.tolerances import TOLERANCES
from tests.kernels.decode_layer_cases import MASK, PROMPT, SPECS, write
from torch_impl import linear

MAX_REL = TOLERANCES["float32"].max_rel
WHY_NOT = build._unsupported(torch_gemm.UPCAST_LIBRARY)  # x86-64 with AVX-512 (not every CI machine), a compiler
needs_kernel = pytest.mark.skipif(WHY_NOT is not None, reason=f"not buildable here: {WHY_NOT}")
# (rows, in, out): gemm.c's register tiles of 12 rows, row blocks of 192, K blocks of 256, panels of 32 columns in
# two halves of 16, and here W's rows gathered two k at a time (an odd `in` leaves one k alone)
ODD_SHAPES = [(9, 1, 1), (11, 7, 5), (12, 255, 16), (13, 257, 17), (25, 300, 33), (32, 64, 32), (193, 513, 67),
              (400, 64, 100), (64, 600, 1100), (9, 1025, 65), (197, 1023, 130)]  # fmt: skip


def operands(rows: int, in_: int, out: int, seed: int = 0, bias: bool = False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_, generator=gen).bfloat16()
    w = torch.randn(out, in_, generator=gen).bfloat16()  # [out, in]: nn.Linear's layout
    b = torch.randn(out, generator=gen).bfloat16() if bias else None
    return x, w, b


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


@needs_kernel
@pytest.mark.parametrize(("rows", "in_", "out"), [(9, 31, 17), (45, 96, 40), (100, 301, 70), (31, 1000, 1025)])
def test_bfloat16_result_is_the_float32_sum_and_bias_rounded_as_torch_rounds(rows, in_, out):
    """The bf16 output is the float32 sum plus the bias, rounded once, bit for bit as torch rounds it (to nearest,
    ties to even), halfway cases included: small integers make many sums exact ties."""
    x, w, b = operands(rows, in_, out, bias=True)
    sums = torch_gemm.upcast(x, w, out_dtype=torch.float32)
    assert torch.equal(torch_gemm.upcast(x, w, b), (sums + b.float()).bfloat16())
    assert torch.equal(torch_gemm.upcast(x, w, b, out_dtype=torch.float32), sums + b.float())
    gen = torch.Generator().manual_seed(3)
    xi = torch.randint(-8, 9, (rows, in_), generator=gen).bfloat16()
    wi = torch.randint(-8, 9, (out, in_), generator=gen).bfloat16() * 37  # sums past bf16's 8 bits: rounded
    sums = torch_gemm.upcast(xi, wi, out_dtype=torch.float32)
    assert torch.equal(sums.double(), xi.double() @ wi.double().T)  # exact in float32
    assert torch.equal(torch_gemm.upcast(xi, wi).view(torch.int16), sums.bfloat16().view(torch.int16))


@needs_kernel
def test_a_rows_sum_does_not_depend_on_its_place_or_the_threads():
    """Each output is one chain of multiply-adds in k order, whatever its row tile, row block, span or thread: a
    row's result is bit for bit the same in a product of 401 rows (three row blocks) as in one of 9, and the same
    on one thread as on the team."""
    x, w, b = operands(401, 600, 70, seed=1, bias=True)
    whole = torch_gemm.upcast(x, w, b, out_dtype=torch.float32)
    for row in (0, 11, 12, 191, 192, 400):
        alone = torch_gemm.upcast(x[row : row + 1].expand(9, -1), w, b, out_dtype=torch.float32)
        assert torch.equal(alone[0], whole[row]) and torch.equal(alone[8], whole[row])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(torch_gemm.upcast(x, w, b, out_dtype=torch.float32), whole)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_strided_input_and_the_flop_counter():
    """x may be a strided view (the launcher makes it contiguous); FlopCounterMode sees the operator's 2 * rows *
    out * in FLOPs, as it counts aten.mm."""
    from torch.utils.flop_counter import FlopCounterMode

    x, w, _ = operands(20, 64, 48)
    wide = torch.cat([x, x], dim=1)[:, ::2]  # [20, 64], strided
    assert torch.equal(torch_gemm.upcast(wide, w), torch_gemm.upcast(wide.contiguous(), w))
    with FlopCounterMode(display=False) as counter:
        got = torch_gemm.upcast(x, w)
    assert counter.get_total_flops() == 2 * 20 * 48 * 64
    assert torch.equal(got, torch_gemm.upcast(x, w))  # through the registered operator: the same product


def test_bad_operands_are_refused_by_name():
    x, w, b = operands(16, 40, 24, bias=True)
    with pytest.raises(ValueError, match=r"upcast: x \(16, 40\) torch.float32"):
        torch_gemm.upcast(x.float(), w)  # not bf16
    with pytest.raises(ValueError, match=r"weight \(40, 24\) torch.bfloat16 \(contiguous: False\)"):
        torch_gemm.upcast(x, w.T)  # W [in, out]: not the kernel's layout
    with pytest.raises(ValueError, match=r"x \(8, 40\)"):
        torch_gemm.upcast(x[:8], w)  # a decode step's rows: gemv's
    with pytest.raises(ValueError, match=r"bias \(23,\)"):
        torch_gemm.upcast(x, w, b[:23])
    with pytest.raises(ValueError, match="out_dtype torch.float16"):
        torch_gemm.upcast(x, w, out_dtype=torch.float16)


@needs_kernel
@pytest.mark.parametrize("shape", list(SPECS))  # Qwen3's, odd widths (76, 100, 20), Qwen2's with q/k/v biases
def test_a_bf16_prompt_on_the_kernel_matches_the_library(tmp_path, shape, monkeypatch):
    """A bf16 model's forward over a 3 x 5 prompt (15 rows: the kernel's) with every product pinned to the kernel
    gives the logits of F.linear within the bf16 table's bound for its depth, the kernel running every product."""
    write(tmp_path, SPECS[shape])
    model = torch_impl.from_pretrained(tmp_path, "bfloat16")
    calls = []
    run = torch_gemm._run_upcast
    monkeypatch.setitem(torch_gemm._RUNS, "upcast", lambda *args: calls.append(args[1].shape) or run(*args))
    with torch.inference_mode(), linear.PATHS.forced("upcast"):
        got = model(PROMPT, attention_mask=MASK).float()
    spec = model.spec
    # every layer's q, k, v, o, gate_up and down projections, and the head over all 15 rows
    assert len(calls) == 6 * spec.num_hidden_layers + 1 and (spec.vocab_size, spec.hidden_size) in calls
    with torch.inference_mode(), linear.PATHS.forced("f_linear"):
        want = model(PROMPT, attention_mask=MASK).float()
    bound = TOLERANCES["bfloat16"].bound(spec.num_hidden_layers)
    keep = torch.from_numpy(MASK).bool()  # padded positions attend to nothing meaningful
    assert ((got - want).abs()[keep].max() / want.abs()[keep].max()).item() <= bound.max_rel
