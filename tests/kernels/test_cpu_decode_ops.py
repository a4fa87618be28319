"""kernels/cpu/decode_ops.c through its torch launcher (torch_decode_ops.py): each row operator against the reference it
stands in for, held to the kernel tolerance table's row (odd widths, float32 and bfloat16, non-contiguous inputs,
Gemma's and OLMo 2's norm options, SwiGLU's exp at its float32 extremes), at a decode step's rows and at a prompt's (cut
over the threads: each row's result that of the row alone); and errors that name the operand (the norm's: its
reference's own). The attention (attend.c): test_cpu_attend.py; when the layers take them: test_cpu_decode_ops_rule.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.cpu import build, torch_decode_ops
from kernels.triton.reference import add_rms_norm_reference, silu_and_mul_reference
from tests.kernels.cpu_operands import DTYPES, name, numpy, randn
from tests.kernels.tolerances import assert_within_tolerance
from torch_impl.rotary_embedding import apply_rotary

CAN_BUILD = build._unsupported() is None  # x86-64 with AVX2 and FMA, and a C compiler: every CI machine
pytestmark = pytest.mark.skipif(not CAN_BUILD, reason=f"the CPU kernels cannot be built here: {build._unsupported()}")
NORM_OPTIONS = [{}, {"offset": 1.0}, {"float32_weight": True}, {"offset": 1.0, "float32_weight": True}]


def test_the_kernels_build_where_they_can():
    """Where gemv.c builds, decode_ops.c must too: a broken source fails here instead of the layers quietly keeping
    the reference."""
    assert build.load("decode_ops") is not None, build.unavailable("decode_ops")
    assert torch_decode_ops.available()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 7, 64, 1031])
@pytest.mark.parametrize("options", NORM_OPTIONS, ids=["plain", "offset", "f32_weight", "gemma"])
def test_add_rms_norm_matches_the_reference(dtype, dim, options):
    base = randn(3, 2, dim, dtype=dtype, seed=dim, scale=2.0)
    x, residual = base[:, 1:], randn(3, 2, dim, dtype=dtype, seed=dim + 1, scale=4.0)[:, :1]  # [3, 1, dim], strided
    weight = randn(dim, dtype=dtype, seed=dim + 2, scale=0.5) + 1
    row = "add_rms_norm_float32_weight" if options.get("float32_weight") else "add_rms_norm"
    with torch.inference_mode():
        out, new = torch_decode_ops.add_rms_norm(x, residual, weight, 1e-6, **options)
        ref_out, ref_new = add_rms_norm_reference(x, residual, weight, 1e-6, **options)
        alone = torch_decode_ops.add_rms_norm(x, None, weight, 1e-6, **options)
        ref_alone = add_rms_norm_reference(x, None, weight, 1e-6, **options)
    assert out.dtype == new.dtype == dtype and out.shape == new.shape == x.shape
    assert_within_tolerance(numpy(new), numpy(ref_new), "new_residual", name(dtype), "residual")
    assert_within_tolerance(numpy(out), numpy(ref_out), row, name(dtype), "with a residual")
    assert_within_tolerance(numpy(alone), numpy(ref_alone), row, name(dtype), "alone")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [1, 7, 64, 1031])
def test_silu_and_mul_matches_the_reference(dtype, inter):
    """Odd widths (the vector loop's tail), values wide enough to reach silu's saturated tails, a strided input
    and the extremes where exp over- or underflows in float32."""
    base = randn(3, 2, 2 * inter, dtype=dtype, seed=inter, scale=3.0)[:, 1:]  # [3, 1, 2I], strided
    extremes = torch.tensor([-200.0, -90.0, -87.5, -20.0, 0.0, 20.0, 88.8, 200.0], dtype=dtype)
    wide = torch.cat([extremes.repeat(-(-inter // 8))[:inter], torch.full((inter,), 2.0, dtype=dtype)])[None, None]
    for x in (base, wide):
        with torch.inference_mode():
            out, ref = torch_decode_ops.silu_and_mul(x), silu_and_mul_reference(x)
        assert out.dtype == dtype and out.shape == ref.shape == (*x.shape[:-1], inter)
        assert torch.isfinite(out).all()
        assert_within_tolerance(numpy(out), numpy(ref), "silu_and_mul", name(dtype), f"[{inter}]")


def test_silu_and_mul_known_answer():
    """silu(1) * 2 = 2 / (1 + e^-1) = 1.4621; silu(-1) * 3 = -3 / (1 + e) = -0.8068; silu(0) * 5 = 0."""
    x = torch.tensor([[[1.0, -1.0, 0.0, 2.0, 3.0, 5.0]]])
    with torch.inference_mode():
        out = torch_decode_ops.silu_and_mul(x)
    np.testing.assert_allclose(out.numpy()[0, 0], [1.4621, -0.8068, 0.0], atol=1e-4)


def test_rms_norm_known_answer():
    """RMSNorm of [3, 4] with eps ~0 and a unit weight is [3, 4] / sqrt(12.5) = [0.8485, 1.1314]."""
    x = torch.tensor([[[3.0, 4.0]]])
    with torch.inference_mode():
        out = torch_decode_ops.add_rms_norm(x, None, torch.ones(2), 1e-12)
    np.testing.assert_allclose(out.numpy()[0, 0], [0.8485, 1.1314], atol=1e-4)


def rope(batch: int, rotary: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [batch, 1, rotary] float32 at positions 0, 37, 74, ... (the rotate-half layout of both halves)."""
    inv = 1.0 / 10000 ** (torch.arange(0, rotary, 2).float() / rotary)
    freqs = (torch.arange(batch) * 37).float()[:, None, None] * inv  # [B, 1, r/2]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "head_dim", "rotary"), [(16, 128, 128), (3, 10, 10), (5, 24, 8)])
def test_rotary_matches_the_reference(dtype, heads, head_dim, rotary):
    """Full and partial (GPT-NeoX: the first `rotary` dims) rotation, bit for bit (the table's "exact" row)."""
    x = randn(2, 1, heads, head_dim, dtype=dtype, seed=heads, scale=2.0)
    cos, sin = rope(2, rotary)
    with torch.inference_mode():
        out = torch_decode_ops.rotary(x, cos, sin)
        with torch_decode_ops.reference_only():
            ref = apply_rotary(x, cos, sin)
    assert_within_tolerance(numpy(out), numpy(ref), "rotary", name(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "d", "rotary"), [(16, 8, 128, 128), (3, 1, 10, 10), (5, 5, 24, 8)])
@pytest.mark.parametrize("options", NORM_OPTIONS, ids=["plain", "offset", "f32_weight", "gemma"])
def test_norm_rotary_is_the_norm_then_the_rotation(dtype, heads, kv_heads, d, rotary, options):
    """Qwen3's q/k step in one call: bit for bit the two operators in turn (each held to its reference above), on
    strided q and k (views of one projection) and a partial rotation."""
    qkv = randn(2, 1, heads + 2 * kv_heads, d, dtype=dtype, seed=heads, scale=2.0)
    q, k = qkv[:, :, :heads], qkv[:, :, heads : heads + kv_heads]
    wq = randn(d, dtype=dtype, seed=heads + 1, scale=0.5) + 1
    wk = randn(d, dtype=dtype, seed=heads + 2, scale=0.5) + 1
    cos, sin = rope(2, rotary)
    with torch.inference_mode():
        q_out, k_out = torch_decode_ops.norm_rotary(q, k, wq, wk, 1e-6, cos, sin, **options)
        q_two = torch_decode_ops.rotary(torch_decode_ops.add_rms_norm(q, None, wq, 1e-6, **options), cos, sin)
        k_two = torch_decode_ops.rotary(torch_decode_ops.add_rms_norm(k, None, wk, 1e-6, **options), cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == dtype
    assert torch.equal(q_out, q_two) and torch.equal(k_out, k_two)


def test_norm_rotary_known_answer():
    """One head [3, 4], eps 0 and weight 1: normed [0.8485, 1.1314]; at angle pi/2 (cos 0, sin 1) the rotate-half
    pair (a, b) becomes (-b, a)."""
    x = torch.tensor([[[[3.0, 4.0]]]])  # [1, 1, 1, 2]
    cos, sin = torch.zeros(1, 1, 2), torch.ones(1, 1, 2)
    with torch.inference_mode():
        q, k = torch_decode_ops.norm_rotary(x, x, torch.ones(2), torch.ones(2), 1e-12, cos, sin)
    np.testing.assert_allclose(q.numpy()[0, 0, 0], [-1.1314, 0.8485], atol=1e-4)
    assert torch.equal(q, k)


def test_bad_operands_name_the_problem():
    with torch.inference_mode():
        # the reference's own checks: the same calls are legal on both paths, refused with the same error
        with pytest.raises(ValueError, match=r"weight has shape \(63,\), expected \(64,\)"):
            torch_decode_ops.add_rms_norm(torch.zeros(1, 1, 64), None, torch.ones(63), 1e-6)
        with pytest.raises(TypeError, match="weight has dtype torch.bfloat16"):
            torch_decode_ops.add_rms_norm(torch.zeros(1, 1, 64), None, torch.ones(64, dtype=torch.bfloat16), 1e-6)
        with pytest.raises(ValueError, match="eps must be"):
            torch_decode_ops.add_rms_norm(torch.zeros(1, 1, 64), None, torch.ones(64), 0.0)
        with pytest.raises(ValueError, match="r even"):
            torch_decode_ops.rotary(torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 9), torch.zeros(1, 1, 9))
        heads, cos = torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 8)
        with pytest.raises(ValueError, match=r"norm_rotary: weight has shape \(7,\), expected \(8,\)"):
            torch_decode_ops.norm_rotary(heads, heads, torch.ones(8), torch.ones(7), 1e-6, cos, cos)
        with pytest.raises(ValueError, match=r"needs q \[B, T, n, d\] and k \[B, T, n_kv, d\]"):
            torch_decode_ops.norm_rotary(heads, torch.zeros(2, 1, 2, 8), torch.ones(8), torch.ones(8), 1e-6, cos, cos)
        with pytest.raises(ValueError, match="cos and sin must be float32"):
            torch_decode_ops.norm_rotary(heads, heads, torch.ones(8), torch.ones(8), 1e-6, cos.double(), cos.double())
        q = torch.zeros(1, 1, 2, 1, 8)
        with pytest.raises(ValueError, match=r"mask \[1, 1, S\] bool"):
            torch_decode_ops.attend(q, torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 8, 3), torch.ones(1, 1, 3), 1.0)
        with pytest.raises(ValueError, match=r"silu_and_mul: x must have shape \[..., 2\*I\].*\(1, 1, 7\)"):
            torch_decode_ops.silu_and_mul(torch.zeros(1, 1, 7))
        with pytest.raises(ValueError, match="float32 or bfloat16 CPU tensors"):
            torch_decode_ops.silu_and_mul(torch.zeros(1, 1, 8, dtype=torch.float16))


def per_row(op, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
    """`op` called on each token row of x [B, T, ...] alone (each call below PARALLEL_MIN elements: one thread), the
    results stacked back; `rest` are cut along with x where they have its leading dims (cos, sin), else passed."""
    rows = []
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            rows.append(op(x[b : b + 1, t : t + 1], *(r[b : b + 1, t : t + 1] if r.dim() > 1 else r for r in rest)))
    return torch.cat(rows, dim=1).view(*x.shape[:2], *rows[0].shape[2:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prompts_rows_are_cut_over_the_threads_without_changing_a_bit(dtype):
    """A prompt's rows (over PARALLEL_MIN = 32768 elements: cut over the OpenMP team) match the reference within the
    table's rows and equal, bit for bit, each row computed alone: no result depends on the cut. Odd widths (1031,
    SwiGLU's 601, a partial rotation of 40 of 80 dims), batch rows of 67 tokens."""
    x, residual = randn(2, 67, 1031, dtype=dtype, seed=1, scale=2.0), randn(2, 67, 1031, dtype=dtype, seed=2)
    weight = randn(1031, dtype=dtype, seed=3, scale=0.5) + 1
    gate_up = randn(2, 67, 2 * 601, dtype=dtype, seed=4, scale=3.0)
    q, k = randn(2, 67, 9, 80, dtype=dtype, seed=5), randn(2, 67, 3, 80, dtype=dtype, seed=6)
    angles = torch.arange(2 * 67 * 40, dtype=torch.float32).view(2, 67, 40) * 0.01
    cos, sin = angles.cos(), angles.sin()
    with torch.inference_mode():
        out, new = torch_decode_ops.add_rms_norm(x, residual, weight, 1e-6)
        ref_out, ref_new = add_rms_norm_reference(x, residual, weight, 1e-6)
        assert_within_tolerance(numpy(out), numpy(ref_out), "add_rms_norm", name(dtype), "prompt")
        assert torch.equal(new, ref_new)  # one rounding of an exact float32 sum: the reference's bits
        alone = per_row(lambda a, r, w: torch_decode_ops.add_rms_norm(a, r, w, 1e-6)[0], x, residual, weight)
        assert torch.equal(out, alone)
        act = torch_decode_ops.silu_and_mul(gate_up)
        assert_within_tolerance(numpy(act), numpy(silu_and_mul_reference(gate_up)), "silu_and_mul", name(dtype))
        assert torch.equal(act, per_row(torch_decode_ops.silu_and_mul, gate_up))
        rotated = torch_decode_ops.rotary(q, cos, sin)
        with torch_decode_ops.reference_only():
            assert_within_tolerance(numpy(rotated), numpy(apply_rotary(q, cos, sin)), "rotary", name(dtype))
        assert torch.equal(rotated, per_row(torch_decode_ops.rotary, q, cos, sin))
        qn, kn = torch_decode_ops.norm_rotary(q, k, weight[:80], weight[1:81], 1e-6, cos, sin)

        def heads_alone(w: torch.Tensor, which: int):  # one token row's heads normed with w and rotated, alone
            return lambda a, c, s: torch_decode_ops.norm_rotary(a, a, w, w, 1e-6, c, s)[which]

        assert torch.equal(qn, per_row(heads_alone(weight[:80], 0), q, cos, sin))
        assert torch.equal(kn, per_row(heads_alone(weight[1:81], 1), k, cos, sin))
