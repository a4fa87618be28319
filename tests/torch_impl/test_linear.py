"""torch_impl/linear.py: which products have a choice of library, that every path computes x @ W^T + b, and
that the measured choice is made once per shape and can be pinned. Nothing here depends on which path is the
faster on this machine: each test holds whichever the measurement picks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_impl.linear as linear_module
import torch_impl.linear as torch_linear
from kernels.cpu import torch_gemm, torch_gemv
from parity.tolerances import TOLERANCES
from spec.path_choice import Pass
from torch_impl.linear import PATHS, Linear, _onednn_available, forms_for, has_choice, linear, path_of

MAX_REL = TOLERANCES["float32"].max_rel  # reordered float32 sums, the table's reviewed bound
BF16_REL = 2.0**-7  # a bfloat16 result rounds to 8 significant bits; the products accumulate in float32


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).abs().max() / b.abs().max()).item()


@pytest.fixture
def fresh_choices():
    """An empty record of choices for the test, the process's own restored afterwards."""
    saved = PATHS.chosen()
    PATHS.clear()
    yield PATHS
    PATHS.clear()
    PATHS._chosen.update(saved)


@pytest.mark.parametrize("path", [None, "f_linear", "onednn", "gemv"])  # None: the measured choice
@pytest.mark.parametrize("lead", [(1,), (3,), (2, 5), (1, 1, 7), (3, 4)])  # 12 rows: past the kernel's 8
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_float64_product(path, lead, bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*lead, 37, generator=gen)
    w = torch.randn(53, 37, generator=gen)  # [out, in], widths that are not powers of two
    b = torch.randn(53, generator=gen) if bias else None
    want = x.double() @ w.double().T + (b.double() if bias else 0)
    with torch.inference_mode():
        got = linear(x, w, b, path=path)
    assert got.shape == (*lead, 53) and got.dtype == torch.float32
    assert max_rel(got, want) <= MAX_REL


@pytest.mark.parametrize("path", PATHS.paths)
@pytest.mark.parametrize("rows", [1, 45])  # a decode step's (gemv's), a prompt's (gemm's where AMX is, upcast's)
def test_bfloat16_paths_match_float64_product(path, rows):
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(rows, 96, generator=gen).bfloat16(), torch.randn(40, 96, generator=gen).bfloat16()
    with torch.inference_mode():
        got = linear(x, w, path=path)
    assert got.dtype == torch.bfloat16
    assert max_rel(got, x.double() @ w.double().T) <= BF16_REL


def test_which_products_have_a_choice():
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    onednn = ("onednn",) if _onednn_available(torch.float32) else ()
    gemv = ("gemv",) if torch_gemv.available() else ()  # built where the processor and a C compiler allow
    with torch.inference_mode():
        assert has_choice(x, w) is bool(onednn or gemv)
        assert forms_for(x, w) == ("f_linear", *onednn, *gemv)
        assert forms_for(x.view(1, 2, 8), w) == ("f_linear", *onednn, *gemv)  # leading dims: the rows they make
        many = torch.randn(torch_gemv.MAX_ROWS + 1, 8)
        assert forms_for(many, w) == ("f_linear", *onednn)  # a float32 GEMM: the libraries'
        bf16_onednn = ("onednn",) if _onednn_available(torch.bfloat16) else ()
        blocks = ("upcast_blocks",)  # every bfloat16 product
        assert forms_for(x.bfloat16(), w.bfloat16()) == ("f_linear", *bf16_onednn, *blocks, *gemv)
        gemm = ("gemm",) if torch_gemm.available() else ()  # built where the processor has AMX
        upcast = ("upcast",) if torch_gemm.upcast_available() else ()  # ... where it has AVX-512
        assert forms_for(many.bfloat16(), w.bfloat16()) == ("f_linear", *bf16_onednn, *blocks, *gemm, *upcast)
        assert not has_choice(x.half(), w.half())  # F.linear only
        assert not has_choice(x, w.T.contiguous().T)  # a transposed view: F.linear handles the strides
        assert not has_choice(x, w.double())  # mixed dtypes: F.linear decides what that means
    wp = torch.nn.Parameter(w)
    assert not has_choice(x, wp)  # autograd is recording: neither oneDNN's op nor the kernel has a backward
    with torch.no_grad():
        assert has_choice(x, wp) is bool(onednn or gemv)


def test_choice_is_measured_once_per_shape(fresh_choices):
    x, w, b = torch.randn(1, 256), torch.randn(320, 256), torch.randn(320)  # 320 KiB: over MIN_CHOICE_BYTES
    if not has_choice(x, w):
        pytest.skip("neither oneDNN's linear nor the CPU kernel runs here: F.linear is the only path")
    with torch.inference_mode():
        assert path_of(x[:, :64], w[:24, :64].contiguous()) == "f_linear"  # 6 KiB: stays in cache, not measured
        assert fresh_choices.chosen() == {}
        first = path_of(x, w, b)
        assert first in PATHS.paths
        (key,) = fresh_choices.chosen()
        assert key == (1, 256, 320, "float32", True)
        choice = fresh_choices.chosen()[key]
        assert set(choice.seconds) == set(forms_for(x, w, b)) and choice.cost > 0  # every path that applies
        assert choice.rule == "every"  # a decode step's product (spec/path_choice.py)
        assert [path_of(x.view(1, 1, 256), w, b) for _ in range(3)] == [first] * 3  # leading dims: the same key
        assert fresh_choices.chosen() == {key: choice}  # not measured again
        path_of(torch.randn(2, 256), w, b)  # another row count: its own measurement
        assert len(fresh_choices.chosen()) == 2
        for rows in (65, 100, 128):  # compute-bound counts: one choice per power-of-two bucket
            path_of(torch.randn(rows, 256), w, b)
        assert len(fresh_choices.chosen()) == 3 and (128, 256, 320, "float32", True) in fresh_choices.chosen()
        assert fresh_choices.chosen()[128, 256, 320, "float32", True].rule == "median"  # a prompt's: COMPUTE_BOUND


def test_rows_key_is_exact_for_streaming_products_and_bucketed_above():
    from torch_impl.linear import STREAM_ROWS, rows_key

    assert [rows_key(r) for r in range(1, STREAM_ROWS + 1)] == list(range(1, STREAM_ROWS + 1))
    assert [rows_key(r) for r in (STREAM_ROWS + 1, 16, 17, 100, 128, 129, 4096)] == [16, 16, 32, 128, 128, 256, 4096]


@pytest.mark.parametrize("path", PATHS.paths)
def test_forced_path_applies_without_measuring(fresh_choices, path):
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    with torch.inference_mode(), PATHS.forced(path):
        want = path if path in forms_for(x, w) else "f_linear"  # float32: no upcast of either kind
        assert path_of(x, w) == want
        layer = Linear(16, 8, bias=True)  # the module's products follow the pin too
        want_out = x.double() @ layer.weight.double().T + layer.bias.double()
        assert max_rel(layer(x), want_out) <= MAX_REL
    assert fresh_choices.chosen() == {}
    with pytest.raises(ValueError, match="unknown path"):
        linear(x, w, path="mkl")


def test_gradients_flow_through_the_autograd_path():
    gen = torch.Generator().manual_seed(1)
    layer = Linear(19, 11, bias=True)
    x = torch.randn(2, 3, 19, generator=gen, requires_grad=True)
    with PATHS.forced("onednn"):  # pinned or not, a product that records gradients takes F.linear
        layer(x).square().sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = layer.weight.detach().clone().requires_grad_(True)
    F.linear(x_ref, w_ref, layer.bias.detach()).square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(layer.weight.grad, w_ref.grad)


@pytest.mark.parametrize("path", [None, "f_linear", "onednn", "gemv"])
def test_non_contiguous_input(path):
    x = torch.randn(37, 6).T  # [6, 37], a transposed view
    w = torch.randn(5, 37)
    with torch.inference_mode():
        assert max_rel(linear(x, w, path=path), x.double() @ w.double().T) <= MAX_REL


@pytest.mark.parametrize("path", PATHS.paths)
def test_flop_counter_sees_every_path(path, monkeypatch):
    """FlopCounterMode counts 2 * tokens * out * in whichever library runs the product (upcast_blocks in blocks)."""
    from torch.utils.flop_counter import FlopCounterMode

    monkeypatch.setattr(torch_linear, "UPCAST_BYTES", 4 * 37 * 10)  # 10 rows a block: 6 blocks
    rows = 11 if path in ("gemm", "upcast") else 3  # the many-row kernels take more than a decode step's rows
    x, w = torch.randn(rows, 37), torch.randn(53, 37)
    if path in ("upcast_blocks", "gemm", "upcast"):
        x, w = x.bfloat16(), w.bfloat16()
    for grad in (False, True):
        with torch.set_grad_enabled(grad), FlopCounterMode(display=False) as counter:
            linear(x, w.requires_grad_(grad), path=path)
        assert counter.get_total_flops() == 2 * rows * 53 * 37


def test_the_first_product_counts_only_its_own_flops():
    """The oneDNN probe runs at a process's first product, maybe inside the caller's FlopCounterMode: it must not
    add FLOPs of its own there (it once added its F.linear's 48, so the count depended on the tests run before), nor
    its oneDNN op's once that op's FLOP formula is registered (by an earlier probe of this process: made sure here)."""
    from torch.utils.flop_counter import FlopCounterMode

    _onednn_available(torch.float32)
    _onednn_available.cache_clear()
    try:
        x, w = torch.randn(3, 37), torch.randn(53, 37)
        with FlopCounterMode(display=False) as counter:
            linear(x, w, path="f_linear")
        assert counter.get_total_flops() == 2 * 3 * 53 * 37
    finally:
        _onednn_available.cache_clear()


def test_without_onednn_or_the_kernel_falls_back_to_f_linear(monkeypatch, fresh_choices):
    _onednn_available.cache_clear()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    monkeypatch.setattr(torch_gemv, "available", lambda: False)  # no compiler, no AVX2: kernels/cpu/build.py
    monkeypatch.setattr(torch_gemm, "available", lambda: False)  # no AMX
    monkeypatch.setattr(torch_gemm, "upcast_available", lambda: False)  # no AVX-512
    try:
        x, w = torch.randn(4, 37), torch.randn(53, 37)
        with torch.inference_mode():
            assert not has_choice(x, w) and path_of(x, w) == "f_linear"
            for path in ("onednn", "gemv"):
                assert max_rel(linear(x, w, path=path), x.double() @ w.double().T) <= MAX_REL
            x16, w16 = torch.randn(12, 37).bfloat16(), torch.randn(53, 37).bfloat16()
            assert forms_for(x16, w16) == ("f_linear", "upcast_blocks")
            for path in ("gemm", "upcast"):
                assert max_rel(linear(x16, w16, path=path), x16.double() @ w16.double().T) <= BF16_REL
        assert fresh_choices.chosen() == {}  # nothing to choose between: nothing measured
    finally:
        _onednn_available.cache_clear()  # the next caller probes the real build again


@pytest.mark.parametrize("bias", [False, True])
def test_upcast_in_blocks_is_exact_where_the_product_is(monkeypatch, bias):
    """bfloat16 small integers: every product and sum is exact in float32 and in bfloat16, so upcast_blocks gives
    F.linear's bits whatever the blocking; 53 output rows in blocks of 10 leave a last block of 3."""
    monkeypatch.setattr(torch_linear, "UPCAST_BYTES", 4 * 37 * 10)
    x = (torch.arange(4 * 37) % 5 - 2).view(4, 37).bfloat16()  # [4, 37], values in -2..2
    w = (torch.arange(53 * 37) % 7 - 3).view(53, 37).bfloat16()  # [53, 37], values in -3..3
    b = torch.arange(53).bfloat16() - 26 if bias else None
    with torch.inference_mode():
        got = linear(x, w, b, path="upcast_blocks")
        assert got.dtype == torch.bfloat16 and got.shape == (4, 53)
        assert torch.equal(got, F.linear(x.float(), w.float(), None if b is None else b.float()).bfloat16())


def test_upcast_in_blocks_matches_float64_product(monkeypatch):
    """Random bfloat16 operands and bias over 6 blocks of 7 weight rows (the last of 6): within one bfloat16
    rounding of the float64 product, as every path."""
    monkeypatch.setattr(torch_linear, "UPCAST_BYTES", 4 * 96 * 7)
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(5, 96, generator=gen).bfloat16(), torch.randn(41, 96, generator=gen).bfloat16()
    b = torch.randn(41, generator=gen).bfloat16()
    with torch.inference_mode():
        got = linear(x, w, b, path="upcast_blocks")
    assert max_rel(got, x.double() @ w.double().T + b.double()) <= BF16_REL


def test_a_models_own_weights_are_timed_where_it_has_enough_of_them(fresh_choices, monkeypatch):
    """Inside `resident_weights`, a few-row product's timing passes run over the model's own weights of its shape
    (in memory already: no arena mapped); too few of them to leave the cache, and the arena's views are timed."""
    weights = [torch.full((256, 1024), float(i)) for i in range(20)]  # 1 MiB each: a pass takes 16
    seen: list[int] = []
    monkeypatch.setitem(linear_module.FORMS, "f_linear", lambda x2, w, b: seen.append(w.data_ptr()))
    x2 = torch.ones(1, 1024)
    with torch.inference_mode(), linear_module.resident_weights([torch.ones(3), *weights]):
        linear_module._candidates(("f_linear",), x2, weights[0], None)["f_linear"]()
    assert seen == [w.data_ptr() for w in weights[:16]]
    seen.clear()
    with torch.inference_mode(), linear_module.resident_weights(weights[:3]):
        linear_module._candidates(("f_linear",), x2, weights[0], None)["f_linear"]()
    arena = linear_module._arena(torch.float32)
    assert len(seen) == 16 and seen[0] == arena.data_ptr() and seen[-1] == arena.data_ptr() + 15 * 256 * 1024 * 4


def test_streaming_passes_evict_their_weights_and_compute_bound_ones_do_not(fresh_choices, monkeypatch):
    """A few-row product's passes, and a table's first rows, are Passes that evict exactly the weights they stream
    before each timed pass (spec/path_choice.py); a prefill-sized product's passes find the caches as they are."""
    evicted: list[list[tuple[int, int]]] = []
    monkeypatch.setattr(linear_module, "evicting", lambda buffers: evicted.append(list(buffers)) or (lambda: None))
    weights = [torch.full((256, 1024), float(i)) for i in range(16)]  # 1 MiB each: a pass takes 16
    with torch.inference_mode(), linear_module.resident_weights(weights):
        few = linear_module._candidates(("gemv", "f_linear"), torch.ones(1, 1024), weights[0], None)
    assert all(isinstance(p, Pass) for p in few.values())
    assert evicted == [[(w.data_ptr(), 256 * 1024 * 4) for w in weights]]
    table = torch.ones(linear_module.STREAM_BYTES // 4096 + 8, 1024)  # larger than a pass: its first rows
    head = linear_module._candidates(("f_linear",), torch.ones(1, 1024), table, None)
    assert isinstance(head["f_linear"], Pass) and evicted[-1] == [(table.data_ptr(), linear_module.STREAM_BYTES)]
    evicted.clear()
    many = linear_module._candidates(("f_linear", "onednn"), torch.ones(64, 1024), weights[0], None)
    assert evicted == [] and not any(isinstance(p, Pass) for p in many.values())
