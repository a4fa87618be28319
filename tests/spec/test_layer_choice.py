"""spec/layer_choice.py: what the pins decide for a layer's one call, every combination (no timing: pins only)."""

from __future__ import annotations

import contextlib

import pytest

from spec.layer_choice import pinned_one_call
from spec.path_choice import PathChoice


@pytest.mark.parametrize(
    ("product", "layer", "want"),
    [
        (None, None, None),  # nothing pinned: the measured choice decides
        ("gemv", None, True),  # the products on the kernel: the call computes exactly them
        ("f_linear", None, False),  # the products on another path: the operators run it
        ("f_linear", "one_call", False),  # ... whatever the layer's own pin says
        (None, "one_call", True),
        (None, "operators", False),
        ("gemv", "operators", False),  # the layer's own pin, where the products allow the call
    ],
)
def test_the_pins_decide(product, layer, want):
    products = PathChoice("products", ("gemv", "f_linear"), cpu=None)
    layers = PathChoice("layers", ("one_call", "operators"), cpu=None)
    with contextlib.ExitStack() as pins:
        if product is not None:
            pins.enter_context(products.forced(product))
        if layer is not None:
            pins.enter_context(layers.forced(layer))
        assert pinned_one_call(products, layers) is want
    assert pinned_one_call(products, layers) is None  # only inside the blocks
