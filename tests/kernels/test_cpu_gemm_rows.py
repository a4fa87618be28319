"""kernels/cpu/torch_gemm.py's two many-row bfloat16 products on nn.Linear's weight [out, in]: `gemm`
(kernels/cpu/gemm_amx_rows.c, AMX tiles) and `upcast` (gemm.c's float32 loops on the widened values,
kernels/cpu/gemm_upcast_rows.c; its own tests in test_cpu_gemm_upcast_rows.py). Here: `gemm` against its float64
reference (reference.py, "rows") at shapes that leave a tail in every loop (blocks of 32 rows of W, 16-token blocks in
pairs, steps of 32 k, K blocks of 8 steps, chunks of rows), which processors build it (kernels/cpu/build.py's ISA);
and for both, each where it is built: the bf16 result as torch rounds the float32 sum plus the bias; an output's sum
independent of its place and of the number of threads; strided input and the FLOP counter; bad operands refused by
name; a bf16 model's prompt on the kernel.

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
CAN_BUILD = build._unsupported(torch_gemm.LIBRARY) is None  # x86-64 with AMX (Sapphire Rapids and later), a compiler
needs_kernel = pytest.mark.skipif(not CAN_BUILD, reason=f"not buildable here: {build._unsupported(torch_gemm.LIBRARY)}")


def kernel(name: str, library: str):
    why = build._unsupported(library)
    return pytest.param(name, id=name, marks=pytest.mark.skipif(why is not None, reason=f"not buildable here: {why}"))


KERNELS = [kernel("gemm", torch_gemm.LIBRARY), kernel("upcast", torch_gemm.UPCAST_LIBRARY)]
# (rows, in, out) and the rows checked alone: several of each kernel's blocks of rows (gemm_amx_rows.c's chunks of
# 512 rows at in 1024, 16-token blocks; gemm.c's row blocks of 192, register tiles of 12)
PLACES = {
    "gemm": ((1100, 1024, 70), (0, 15, 16, 31, 32, 511, 512, 1099)),
    "upcast": ((401, 600, 70), (0, 11, 12, 191, 192, 400)),
}


def operands(rows: int, in_: int, out: int, seed: int = 0, bias: bool = False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_, generator=gen).bfloat16()
    w = torch.randn(out, in_, generator=gen).bfloat16()  # [out, in]: nn.Linear's layout
    b = torch.randn(out, generator=gen).bfloat16() if bias else None
    return x, w, b


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> np.ndarray:
    as_f32 = lambda t: None if t is None else t.float().numpy()  # noqa: E731 (bf16 widens exactly)
    return gemv_reference(as_f32(x), as_f32(w), as_f32(b), "rows")


def rel(got: torch.Tensor, want: np.ndarray) -> float:
    return float(np.abs(got.double().numpy() - want).max() / max(np.abs(want).max(), 1e-30))


def test_the_kernel_builds_where_the_processor_has_amx():
    """Where the processor has AMX (and the AVX-512 it is compiled with), the library builds and Linux grants the
    tile state (a broken source fails here instead of torch_impl quietly keeping the libraries' GEMM); elsewhere the
    reason names what is missing."""
    if not CAN_BUILD:
        assert "amx" in build._unsupported(torch_gemm.LIBRARY) or build._unsupported() is not None
        assert not torch_gemm.supports(*operands(16, 32, 32)[:2], None)
        return
    assert torch_gemm.available(), torch_gemm.unavailable()


def test_processors_without_amx_get_a_reason(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl"}))
    assert build._unsupported(torch_gemm.LIBRARY) == "the processor lacks amx_tile, amx_bf16"
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # an AVX2 machine (AMD EPYC here)
    assert (
        build._unsupported(torch_gemm.LIBRARY) == "the processor lacks avx512f, avx512bw, avx512vl, amx_tile, amx_bf16"
    )


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    ("rows", "in_", "out"),
    [(9, 1, 1), (9, 31, 17), (16, 32, 16), (33, 33, 47), (45, 96, 40), (64, 256, 32), (100, 300, 70),
     (31, 1000, 1025), (1100, 1024, 96), (600, 3000, 33), (2000, 40, 50)],
)  # fmt: skip
def test_matches_float64_product(rows, in_, out, bias):
    """Tails everywhere: W's last block of 32 rows partial (1, 17, 47, 1025, ...), widths that are not a whole step
    (1, 31, 33, 300, 1000, 3000: W's blocks copied zero-padded), a last K block short of 8 steps (300, 1000, 3000), a
    partial pair of token blocks (9, 33, 45, 100), rows in several chunks (1100 at in 1024: chunks of 512; 2000 at
    in 40: chunks of 1024)."""
    x, w, b = operands(rows, in_, out, bias=bias)
    got = torch_gemm.gemm(x, w, b, out_dtype=torch.float32)
    assert got.shape == (rows, out) and got.dtype == torch.float32
    assert rel(got, reference(x, w, b)) <= MAX_REL


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize(("rows", "in_", "out"), [(9, 31, 17), (45, 96, 40), (100, 301, 70), (31, 1000, 1025)])
def test_bfloat16_result_is_the_float32_sum_and_bias_rounded_as_torch_rounds(name, rows, in_, out):
    """The bf16 output is the float32 output (the sum plus the bias) rounded once, bit for bit as torch rounds it (to
    nearest, ties to even), halfway cases included: small integers make many sums exact ties."""
    product = getattr(torch_gemm, name)
    x, w, b = operands(rows, in_, out, bias=True)
    assert torch.equal(product(x, w, b), product(x, w, b, out_dtype=torch.float32).bfloat16())
    # the bias is added to the finished float32 sum, in float32: exactly torch's addition
    assert torch.equal(product(x, w, b, out_dtype=torch.float32), product(x, w, out_dtype=torch.float32) + b.float())
    gen = torch.Generator().manual_seed(3)
    xi = torch.randint(-8, 9, (rows, in_), generator=gen).bfloat16()
    wi = torch.randint(-8, 9, (out, in_), generator=gen).bfloat16() * 37  # sums past bf16's 8 bits: rounded
    sums = product(xi, wi, out_dtype=torch.float32)
    assert torch.equal(sums.double(), xi.double() @ wi.double().T)  # exact in float32
    assert torch.equal(product(xi, wi).view(torch.int16), sums.bfloat16().view(torch.int16))


@pytest.mark.parametrize("name", KERNELS)
def test_a_rows_sum_does_not_depend_on_its_place_or_the_threads(name):
    """Each output is one chain of products in k order (tile products; fused multiply-adds), whatever its block of
    rows, K block or thread: a row's result is bit for bit the same in a product of several blocks of rows (PLACES)
    as in one of 9, and the same on one thread as on the team."""
    product = getattr(torch_gemm, name)
    shape, rows = PLACES[name]
    x, w, b = operands(*shape, seed=1, bias=True)
    whole = product(x, w, b, out_dtype=torch.float32)
    for row in rows:
        alone = product(x[row : row + 1].expand(9, -1), w, b, out_dtype=torch.float32)
        assert torch.equal(alone[0], whole[row]) and torch.equal(alone[8], whole[row])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(product(x, w, b, out_dtype=torch.float32), whole)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("name", KERNELS)
def test_strided_input_and_the_flop_counter(name):
    """x may be a strided view (the launcher makes it contiguous); FlopCounterMode sees the operator's 2 * rows *
    out * in FLOPs, as it counts aten.mm."""
    from torch.utils.flop_counter import FlopCounterMode

    product = getattr(torch_gemm, name)
    x, w, _ = operands(20, 64, 48)
    wide = torch.cat([x, x], dim=1)[:, ::2]  # [20, 64], strided
    assert torch.equal(product(wide, w), product(wide.contiguous(), w))
    with FlopCounterMode(display=False) as counter:
        got = product(x, w)
    assert counter.get_total_flops() == 2 * 20 * 48 * 64
    assert torch.equal(got, product(x, w))  # through the registered operator: the same product


@pytest.mark.parametrize("name", ["gemm", "upcast"])  # refused whether or not the kernel is built (there, for that too)
def test_bad_operands_are_refused_by_name(name):
    product = getattr(torch_gemm, name)
    x, w, b = operands(16, 40, 24, bias=True)
    with pytest.raises(ValueError, match=rf"{name}: x \(16, 40\) torch.float32"):
        product(x.float(), w)  # not bf16
    with pytest.raises(ValueError, match=r"weight \(40, 24\) torch.bfloat16 \(contiguous: False\)"):
        product(x, w.T)  # W [in, out]: not the kernel's layout
    with pytest.raises(ValueError, match=r"x \(8, 40\)"):
        product(x[:8], w)  # a decode step's rows: gemv's
    with pytest.raises(ValueError, match=r"bias \(23,\)"):
        product(x, w, b[:23])
    with pytest.raises(ValueError, match="out_dtype torch.float16"):
        product(x, w, out_dtype=torch.float16)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("shape", list(SPECS))  # Qwen3's, odd widths (76, 100, 20), Qwen2's with q/k/v biases
def test_a_bf16_prompt_on_the_kernel_matches_the_library(tmp_path, name, shape, monkeypatch):
    """A bf16 model's forward over a 3 x 5 prompt (15 rows: the kernel's) with every product pinned to the kernel
    gives the logits of F.linear within the bf16 table's bound for its depth, the kernel running every product."""
    write(tmp_path, SPECS[shape])
    model = torch_impl.from_pretrained(tmp_path, "bfloat16")
    calls = []
    run = torch_gemm._RUNS[name]
    monkeypatch.setitem(torch_gemm._RUNS, name, lambda *args: calls.append(args[1].shape) or run(*args))
    with torch.inference_mode(), linear.PATHS.forced(name):
        got = model(PROMPT, attention_mask=MASK).float()
    spec = model.spec
    # every layer's q, k, v, o, gate_up and down projections, and the head over all 15 rows
    assert len(calls) == 6 * spec.num_hidden_layers + 1 and (spec.vocab_size, spec.hidden_size) in calls
    with torch.inference_mode(), linear.PATHS.forced("f_linear"):
        want = model(PROMPT, attention_mask=MASK).float()
    bound = TOLERANCES["bfloat16"].bound(spec.num_hidden_layers)
    keep = torch.from_numpy(MASK).bool()  # padded positions attend to nothing meaningful
    assert ((got - want).abs()[keep].max() / want.abs()[keep].max()).item() <= bound.max_rel
