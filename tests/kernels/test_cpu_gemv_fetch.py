"""kernels/cpu/gemv_fetch.py: the product kernel's software fetch, chosen by measurement per (dtype, layout) and used
by every launcher; either form gives the same bits (tests/kernels/test_cpu_gemv_isa.py checks each loop)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from kernels.cpu import build, evict, gemv_fetch, torch_gemv

needs_kernel = pytest.mark.skipif(
    build.unavailable("gemv") is not None or not evict.available(),
    reason=f"kernel or eviction not built here: {build.unavailable('gemv') or build.unavailable('evict')}",
)


@pytest.fixture
def fresh():
    """A process whose choices are measured again, and forgotten after the test (no other test sees them)."""
    gemv_fetch.FETCH.clear()
    yield gemv_fetch.FETCH
    gemv_fetch.FETCH.clear()


@pytest.mark.parametrize(("dtype", "layout"), [("float16", "rows"), ("float32", "transposed"), ("bf16", "cols")])
def test_an_unknown_dtype_or_layout_is_refused_by_name(dtype, layout):
    with pytest.raises(ValueError, match=f"dtype '{dtype}'.*layout '{layout}'"):
        gemv_fetch.fetch(dtype, layout)


@needs_kernel
@pytest.mark.parametrize("dtype", gemv_fetch.DTYPES)
@pytest.mark.parametrize("layout", gemv_fetch.LAYOUTS)
def test_each_pair_is_measured_once_on_both_forms(fresh, dtype, layout):
    code = gemv_fetch.fetch(dtype, layout)
    choice = fresh.chosen()[(dtype, layout)]
    assert code == gemv_fetch.CODES[choice.path]
    assert set(choice.seconds) == {"ahead", "hardware"} and all(s > 0 for s in choice.seconds.values())
    assert choice.cost > 0
    assert gemv_fetch.fetch(dtype, layout) == code and fresh.chosen()[(dtype, layout)] is choice  # kept, not re-timed


def test_forced_pins_without_measuring(fresh):
    with fresh.forced("hardware"):
        assert gemv_fetch.fetch("bfloat16", "cols") == 0
    with fresh.forced("ahead"):
        assert gemv_fetch.fetch("float32", "rows") == 1
    assert fresh.chosen() == {}


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_launcher_gives_the_same_bits_either_way(fresh, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1031, generator=gen).to(dtype)
    w = torch.randn(517, 1031, generator=gen).to(dtype)
    with fresh.forced("ahead"):
        ahead = torch_gemv.gemv(x, w)
    with fresh.forced("hardware"):
        hardware = torch_gemv.gemv(x, w)
    assert torch.equal(ahead, hardware)
    want = x.double() @ w.double().T
    assert (hardware.double() - want).abs().max() <= 1e-2 * want.abs().max()  # not a stub: the product itself


@needs_kernel
def test_jax_launcher_bakes_the_choice_into_the_call(fresh):
    jax = pytest.importorskip("jax")
    from kernels.cpu import jax_gemv

    if not jax_gemv.available():
        pytest.skip(f"XLA kernel not built here: {build.unavailable('gemv_xla')}")
    gen = np.random.default_rng(0)
    x = jax.numpy.asarray(gen.standard_normal((2, 300), np.float32))
    w = jax.numpy.asarray(gen.standard_normal((300, 1061), np.float32).astype(ml_dtypes.bfloat16))
    texts = {}
    for form in ("ahead", "hardware"):
        with fresh.forced(form):
            fn = jax.jit(lambda x, w: jax_gemv.gemv(x, w, "cols"))
            texts[form] = (fn.lower(x, w).as_text(), np.asarray(fn(x, w)))
    assert "fetch = 1" in texts["ahead"][0] and "fetch = 0" in texts["hardware"][0]
    assert np.array_equal(texts["ahead"][1], texts["hardware"][1])
