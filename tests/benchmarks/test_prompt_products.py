"""benchmarks/prompt_products.py: a layer's prompt products of the 0.6B shape (a known count), every form each backend
offers here timed in a short real run, and the layer's totals read from those times."""

from __future__ import annotations

import json

import pytest

from benchmarks import prompt_products
from benchmarks.qwen3_shape import SHAPES
from kernels.cpu import jax_gemm, torch_gemm


def test_a_layers_products_are_the_shapes_weights():
    """q, k, v, o, gate_up and down of Qwen3-0.6B: 15,728,640 weights a layer (28 layers of them and the 1024-wide
    norms and the tied table make its 596,049,920 parameters)."""
    products = prompt_products.layer_products(SHAPES["qwen3-0.6b"])
    assert [name for name, _, _ in products] == ["q", "k", "v", "o", "gate_up", "down"]
    assert sum(i * o for _, i, o in products) == 15_728_640
    assert products[1][1:] == products[2][1:] == (1024, 1024)  # k and v: one shape, both counted


def test_a_moe_shape_is_refused_by_name():
    moe = next(spec for spec in SHAPES.values() if spec.num_experts)
    with pytest.raises(ValueError, match=f"{moe.num_experts} experts"):
        prompt_products.layer_products(moe)


def test_the_layer_totals_are_the_shapes_times():
    products = [("a", 4, 8), ("b", 4, 8), ("c", 8, 4)]
    seconds = {
        (4, 8): {"jax/dot": 2.0, "jax/gemm": 1.0, "torch/f_linear": 3.0, "torch/upcast_blocks": 4.0},
        (8, 4): {"jax/dot": 1.0, "jax/gemm": 5.0, "torch/f_linear": 2.0},
    }
    layer = prompt_products.summarize(products, seconds)
    assert layer["jax"] == {"baseline_s": 5.0, "fastest_s": 3.0, "ratio": 5.0 / 3.0}  # a shape counted per product
    assert layer["torch"] == {"baseline_s": 8.0, "fastest_s": 8.0, "ratio": 1.0}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_run_times_every_offered_form(tmp_path, capsys, dtype):
    out = tmp_path / "figures.json"
    assert prompt_products.main(["--dtype", dtype, "--rows", "16", "--rounds", "2", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["layer_flops"] == 2 * 16 * 15_728_640 and figures["machine"]["cores"] >= 1
    assert set(figures["seconds"]) == {"1024x2048", "1024x1024", "2048x1024", "1024x6144", "3072x1024"}
    for timed in figures["seconds"].values():
        assert {"jax/dot", "torch/f_linear"} <= set(timed) and all(s > 0 for s in timed.values())
        assert ("jax/upcast" in timed) == (dtype == "bfloat16" and jax_gemm.upcast_available())
        assert ("torch/upcast" in timed) == (dtype == "bfloat16" and torch_gemm.upcast_available())
        if dtype == "bfloat16":
            assert "torch/upcast_blocks" in timed
    for backend in ("jax", "torch"):
        assert figures["layer"][backend]["fastest_s"] <= figures["layer"][backend]["baseline_s"]
    assert "a layer's products" in capsys.readouterr().out
