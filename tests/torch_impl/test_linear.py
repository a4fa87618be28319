"""torch_impl/linear.py: which path a product takes, and that every path computes x @ W^T + b."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parity.tolerances import TOLERANCES
from torch_impl.linear import Linear, linear, uses_onednn

MAX_REL = TOLERANCES["float32"].max_rel  # reordered float32 sums, the table's reviewed bound


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("lead", [(1,), (3,), (2, 5), (1, 1, 7)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_float64_product(lead, bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*lead, 37, generator=gen)
    w = torch.randn(53, 37, generator=gen)  # [out, in], widths that are not powers of two
    b = torch.randn(53, generator=gen) if bias else None
    want = x.double() @ w.double().T + (b.double() if bias else 0)
    with torch.inference_mode():
        got = linear(x, w, b)
    assert got.shape == (*lead, 53) and got.dtype == torch.float32
    assert max_rel(got, want) <= MAX_REL


def test_path_choice():
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    onednn = torch.backends.mkldnn.is_available()
    with torch.inference_mode():
        assert uses_onednn(x, w) is onednn
        assert not uses_onednn(x.bfloat16(), w.bfloat16())  # low precision already goes to oneDNN via F.linear
        assert not uses_onednn(x, w.T)  # a transposed view: F.linear handles the strides
    wp = torch.nn.Parameter(w)
    assert not uses_onednn(x, wp)  # autograd is recording: the oneDNN op has no backward
    with torch.no_grad():
        assert uses_onednn(x, wp) is onednn


def test_gradients_flow_through_the_autograd_path():
    gen = torch.Generator().manual_seed(1)
    layer = Linear(19, 11, bias=True)
    x = torch.randn(2, 3, 19, generator=gen, requires_grad=True)
    layer(x).square().sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = layer.weight.detach().clone().requires_grad_(True)
    F.linear(x_ref, w_ref, layer.bias.detach()).square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(layer.weight.grad, w_ref.grad)


def test_non_contiguous_input():
    x = torch.randn(37, 6).T  # [6, 37], a transposed view
    w = torch.randn(5, 37)
    with torch.inference_mode():
        assert max_rel(linear(x, w), x.double() @ w.double().T) <= MAX_REL


def test_flop_counter_sees_every_path():
    """FlopCounterMode counts 2 * tokens * out * in whichever library runs the product."""
    from torch.utils.flop_counter import FlopCounterMode

    x, w = torch.randn(3, 37), torch.randn(53, 37)
    for grad in (False, True):
        with torch.set_grad_enabled(grad), FlopCounterMode(display=False) as counter:
            linear(x, w.requires_grad_(grad))
        assert counter.get_total_flops() == 2 * 3 * 53 * 37


def test_without_onednn_falls_back_to_f_linear(monkeypatch):
    from torch_impl import linear as linear_module

    linear_module._onednn_available.cache_clear()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    try:
        x, w = torch.randn(4, 37), torch.randn(53, 37)
        with torch.inference_mode():
            assert not uses_onednn(x, w)
            assert max_rel(linear(x, w), x.double() @ w.double().T) <= MAX_REL
    finally:
        linear_module._onednn_available.cache_clear()  # the next caller probes the real build again
