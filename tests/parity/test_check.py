"""`parity.check` on real backends: parity holds on the built-in default and on transformers-written checkpoints,
at float32, bfloat16 and float16, with reference and fused kernels, and against transformers itself.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import jax_impl
import parity
import torch_impl
from parity import TOLERANCES, component_order, hf_components
from parity.compare import judge
from tests.hf_configs import HF_CONFIGS

HAS_FUSED = importlib.util.find_spec("triton") is not None and all(
    importlib.util.find_spec(m) is not None for m in ("kernels.triton.rms_norm", "kernels.pallas.swiglu")
)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_default_checkpoint_passes(default_dir, dtype):
    report = parity.check(default_dir, dtype=dtype, seq_len=16, batch=2)
    assert report.passed, report.format()
    assert report.first_divergence is None and report.verdict_line().startswith("PASS")
    (comparison,) = report.comparisons
    assert [r.name for r in comparison.results] == component_order(2)
    assert comparison.result("embed").metrics.max_abs == 0.0  # a gather: bit-identical in every dtype
    if dtype == "float32":
        assert report.drift == []
        assert max(r.metrics.max_rel for r in comparison.results) < 3e-6  # measured ~1e-6; tolerance 1e-5
    else:
        assert [d.label for d in report.drift] == ["torch vs torch/float32", "jax vs jax/float32"]
        # the dtype really ran: its drift from float32 is of the order of its unit roundoff
        u = TOLERANCES[dtype].unit_roundoff
        assert all(u / 4 < d.result("logits").metrics.max_rel < 64 * u for d in report.drift)


def test_reference_hf_on_default(default_dir):
    for dtype in ("float32", "bfloat16"):
        report = parity.check(default_dir, dtype=dtype, reference="hf", seq_len=16, batch=2, baseline=False)
        assert report.passed, report.format()
        labels = [c.label for c in report.comparisons]
        assert labels == ["torch vs jax", "torch vs hf", "jax vs hf"]
        assert [r.name for r in report.comparisons[1].results] == hf_components(2)


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_transformers_checkpoints_pass_against_transformers(hf_checkpoint, name):
    """Checkpoints written by transformers itself: untied heads, q/k/v bias, GQA 1-4, llama3/linear rope scaling."""
    report = parity.check(hf_checkpoint(name), reference="hf", seq_len=12, batch=2)
    assert report.passed, report.format()


@pytest.mark.skipif(not HAS_FUSED, reason="fused kernels (triton, kernels/triton, kernels/pallas) not available")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_kernels_pass(default_dir, dtype):
    report = parity.check(default_dir, dtype=dtype, kernels="fused", seq_len=8, batch=1, baseline=False)
    assert report.kernels == {"torch": "fused", "jax": "fused"}
    assert report.passed, report.format()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_last_position_logits_equal_last_row_of_full_logits(default_dir, dtype):
    """last_only runs the final norm and head on the last position only; the result is the full run's last row.

    JAX gives identical bits. torch on CPU may not: a [B, 1, H] @ [H, V] product goes through a different
    BLAS kernel (gemv) than [B, T, H] @ [H, V], which sums in another order; float32 tolerance then applies.
    """
    ids = np.random.default_rng(3).integers(0, 263, (2, 11))
    tol = TOLERANCES[dtype]
    torch_model = torch_impl.from_pretrained(default_dir, dtype)
    with torch.inference_mode():
        full, last = torch_model(ids).float().numpy(), torch_model(ids, last_only=True).float().numpy()
    assert last.shape == (2, 1, 263)
    result = judge("logits", last, full[:, -1:], num_layers=2, tolerance=tol)
    assert result.passed, result.reason
    jax_model = jax_impl.from_pretrained(default_dir, dtype)
    jfull, jlast = (np.asarray(jax_model(ids, last_only=flag)).astype(np.float32) for flag in (False, True))
    result = judge("logits", jlast, jfull[:, -1:], num_layers=2, tolerance=tol)  # a [B, 1] product may sum
    assert result.passed, result.reason  # in another order than the [B, T] one on another processor


def test_prompt_is_tokenized_with_the_checkpoint_tokenizer(default_dir):
    report = parity.check(default_dir, prompt="Hi!", batch=2)
    assert report.passed
    assert report.ids == [[72, 105, 33]] * 2  # the default tokenizer is byte-level: one id per byte


def test_ids_are_used_as_given(default_dir):
    report = parity.check(default_dir, ids="1,2,3;4,5,6")
    assert report.passed and report.ids == [[1, 2, 3], [4, 5, 6]] and report.input_shape == (2, 3)
    assert parity.check(default_dir, ids=[7, 8]).input_shape == (1, 2)
