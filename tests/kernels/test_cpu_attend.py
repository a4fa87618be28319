"""kernels/cpu/attend.c through its torch launcher (torch_decode_ops.attend): a decode step's attention over the KV
cache's views and a prompt's (attend_rows: blocks of query steps as small matrix products, keys past a row's causal
end skipped) against torch_impl.attention.attend, held to the kernel tolerance table's "attention" row: odd head
widths, groups of 1 to 8 query heads, soft-capping, causal masks with earlier cache slots, left padding and fully
masked rows, step counts that are not a multiple of the kernel's block of 16.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from kernels.cpu import build, torch_decode_ops
from tests.kernels.cpu_operands import DTYPES, name, numpy, randn
from tests.kernels.tolerances import assert_within_tolerance
from torch_impl.attention import attend

CAN_BUILD = build._unsupported() is None  # x86-64 with AVX2 and FMA, and a C compiler: every CI machine
pytestmark = pytest.mark.skipif(not CAN_BUILD, reason=f"the CPU kernels cannot be built here: {build._unsupported()}")


def cache_views(b: int, n_kv: int, d: int, keys: int, dtype: torch.dtype, seed: int):
    """Keys [B, n_kv, S, d] and values [B, n_kv, d, S] as the KV cache hands them out: views of longer buffers."""
    k = randn(b, n_kv, keys + 5, d, dtype=dtype, seed=seed, scale=2.0)
    v = randn(b, n_kv, d, keys + 5, dtype=dtype, seed=seed + 1, scale=2.0)
    return k.narrow(2, 0, keys), v.narrow(3, 0, keys)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("b", "n_kv", "groups", "d", "keys"),
    # the last two: a cache, then a head, longer than attend.c's SHORT_ROW (256), whose rows it sums eight at a time
    [(1, 8, 2, 128, 25), (2, 3, 1, 7, 1), (3, 2, 3, 20, 37), (2, 2, 2, 40, 263), (1, 1, 2, 300, 9)],
)
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_attention_matches_the_reference(dtype, b, n_kv, groups, d, keys, softcap):
    q = randn(b, 1, n_kv, groups, d, dtype=dtype, seed=keys, scale=2.0)
    k, v = cache_views(b, n_kv, d, keys, dtype, seed=d)
    mask = torch.rand(b, 1, keys, generator=torch.Generator().manual_seed(keys)) > 0.3
    mask[:, :, 0] = True
    with torch.inference_mode():
        out = torch_decode_ops.attend(q, k, v, mask, d**-0.5, softcap)
        with torch_decode_ops.reference_only():
            ref = attend(q, k, v, mask, d**-0.5, softcap)
    assert out.shape == q.shape and out.dtype == dtype
    assert_within_tolerance(numpy(out), numpy(ref), "attention", name(dtype))


def test_a_fully_masked_row_is_the_references_uniform_mean_not_nan():
    q = randn(2, 1, 2, 2, 16, dtype=torch.float32, seed=0)
    k, v = cache_views(2, 2, 16, 9, torch.float32, seed=1)
    mask = torch.ones(2, 1, 9, dtype=torch.bool)
    mask[1] = False  # a padding row: nothing to attend to
    with torch.inference_mode():
        out = torch_decode_ops.attend(q, k, v, mask, 0.25)
        with torch_decode_ops.reference_only():
            ref = attend(q, k, v, mask, 0.25)
    assert torch.isfinite(out).all()
    assert_within_tolerance(numpy(out), numpy(ref), "attention", "float32")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("b", "t", "cached", "n_kv", "groups", "d"),
    [(1, 128, 0, 8, 2, 128), (2, 37, 0, 3, 3, 7), (1, 17, 5, 2, 8, 40), (2, 33, 30, 1, 1, 20), (1, 2, 0, 2, 2, 16),
     (2, 45, 7, 2, 3, 64), (1, 33, 0, 1, 5, 32)],  # the last two (and the first): bf16 on AMX where it runs
)  # fmt: skip
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_a_prompts_attention_matches_the_reference(dtype, b, t, cached, n_kv, groups, d, softcap):
    """A prompt of t steps after `cached` earlier slots, causal (step i sees slots up to cached + i), the second
    batch row left-padded by 3 slots with one fully masked step: the blocked kernel against the reference."""
    s = cached + t
    q = randn(b, t, n_kv, groups, d, dtype=dtype, seed=t, scale=2.0)
    k, v = cache_views(b, n_kv, d, s, dtype, seed=d + t)
    mask = torch.ones(t, s, dtype=torch.bool).tril(cached)[None].repeat(b, 1, 1)  # [B, T, S]
    if b > 1:
        mask[1, :, :3] = False  # left padding
        mask[1, 1] = False  # a padding step: nothing to attend to
    with torch.inference_mode():
        out = torch_decode_ops.attend(q, k, v, mask, d**-0.5, softcap)
        with torch_decode_ops.reference_only():
            ref = attend(q, k, v, mask, d**-0.5, softcap)
    assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
    assert_within_tolerance(numpy(out), numpy(ref), "attention", name(dtype), f"prompt of {t}")


@pytest.mark.parametrize(("dtype", "d"), [(torch.float32, 16), (torch.bfloat16, 32)])  # bf16 32: AMX where it runs
def test_a_prompts_attention_skips_only_what_weighs_nothing(dtype, d):
    """Keys past every row's last allowed one hold NaN: a kernel that read them (or weighed them by anything but the
    skip) would return NaN; keys before a row's end that are masked weigh exactly 0 as in the reference."""
    t = 20
    q = randn(1, t, 2, 2, d, dtype=dtype, seed=1)
    k, v = cache_views(1, 2, d, t + 4, dtype, seed=2)
    mask = torch.ones(1, t, t + 4, dtype=torch.bool).tril()
    mask[..., t:] = False
    mask[0, :, 2] = False  # a masked key inside every row's range
    k[:, :, t:] = float("nan")
    v[..., t:] = float("nan")
    with torch.inference_mode():
        out = torch_decode_ops.attend(q, k, v, mask, 0.25)
        with torch_decode_ops.reference_only():
            ref = attend(q[..., :], k[:, :, :t], v[..., :t], mask[..., :t], 0.25)
    assert torch.isfinite(out).all()
    assert_within_tolerance(numpy(out), numpy(ref), "attention", name(dtype), "skipped keys")


def run_items(symbol: str, q, k, v, mask, scale: float) -> torch.Tensor:
    """attend_rows' items of one batch row, every one through the C function `symbol` (an item's own signature)."""
    item, out = getattr(build.load("decode_ops"), symbol), torch.empty_like(q)
    item.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_long] * 10 + [ctypes.c_float] * 2
    _, t, n_kv, g, d = q.shape
    s = k.shape[2]
    for i in range(n_kv * ((t + 15) // 16)):
        item(q.data_ptr(), k.data_ptr(), v.data_ptr(), mask.data_ptr(), out.data_ptr(), i, t, n_kv, g, d, s, s,
             k.stride(1), v.stride(1), v.stride(2), scale, 0.0)  # fmt: skip
    return out


def amx_operands(t: int = 40, cached: int = 3, n_kv: int = 2, g: int = 3, d: int = 64):
    q = randn(1, t, n_kv, g, d, dtype=torch.bfloat16, seed=5, scale=2.0)
    k, v = (x.contiguous() for x in cache_views(1, n_kv, d, cached + t, torch.bfloat16, seed=6))
    return q, k, v, torch.ones(1, t, cached + t, dtype=torch.bool).tril(cached)


@pytest.mark.skipif(not CAN_BUILD or not build.load("decode_ops").attend_amx_usable(), reason="no AMX tiles here")
def test_a_bf16_prompt_takes_the_amx_item_where_it_runs():
    """Where the processor has AMX (and d is a multiple of 32), attend_rows' items are attend_amx.c's, bit for bit."""
    q, k, v, mask = amx_operands()
    with torch.inference_mode():
        out = torch_decode_ops.attend(q, k, v, mask, 0.125)
    assert torch.equal(out, run_items("attend_rows_bf16_amx_item", q, k, v, mask, 0.125))


def test_the_loops_that_stand_in_for_the_amx_item_match_the_reference():
    """The same operands through attend.c's own loops, which every processor without AMX runs (and this one, where
    AMX runs, does not otherwise exercise at these widths)."""
    q, k, v, mask = amx_operands()
    with torch.inference_mode(), torch_decode_ops.reference_only():
        ref = attend(q, k, v, mask, 0.125)
    out = run_items("attend_rows_bf16_loops_item", q, k, v, mask, 0.125)
    assert_within_tolerance(numpy(out), numpy(ref), "attention", "bfloat16", "attend.c's loops")
