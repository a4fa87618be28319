"""Unit tests of the metrics, the tolerance table, the forward-order walk and the report (no backends)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from parity import TOLERANCES, array_metrics, compare_traces, component_order, logits_metrics, tolerance_for
from parity.compare import judge
from parity.components import hf_components, layers_before, residual_stream
from parity.report import Report
from parity.tolerances import describe
from spec import DEFAULT_SPEC, InputError

RNG = np.random.default_rng(0)


def test_identical_arrays_have_zero_error():
    a = RNG.standard_normal((2, 5, 7)).astype(np.float32)
    m = array_metrics(a, a.copy())
    assert (m.max_abs, m.mean_abs, m.max_rel, m.rms_rel) == (0.0, 0.0, 0.0, 0.0)
    assert m.cosine == pytest.approx(1.0, abs=1e-15) and m.finite


def test_max_rel_is_relative_to_the_reference_scale():
    ref = np.array([[4.0, -2.0, 0.0, 1.0]], np.float32)
    test = ref + np.array([[0.0, 0.0, 0.02, 0.0]], np.float32)  # an error next to a zero: elementwise rel = inf
    m = array_metrics(test, ref)
    assert m.max_abs == pytest.approx(0.02) and m.max_rel == pytest.approx(0.02 / 4.0)
    assert m.mean_abs == pytest.approx(0.005) and m.scale == 4.0


def test_chunked_accumulation_matches_one_pass():
    a = RNG.standard_normal(10_001).astype(np.float32)
    b = a + 1e-3 * RNG.standard_normal(10_001).astype(np.float32)
    whole, chunked = array_metrics(a, b), array_metrics(a, b, chunk=97)
    for field in ("max_abs", "mean_abs", "max_rel", "rms_rel", "cosine"):
        assert getattr(chunked, field) == pytest.approx(getattr(whole, field), rel=1e-12)


def test_cosine_of_zero_arrays():
    z = np.zeros((3,), np.float32)
    assert array_metrics(z, z).cosine == 1.0
    assert array_metrics(np.ones(3, np.float32), z).cosine == 0.0


def test_non_finite_fails_with_a_reason():
    ref = RNG.standard_normal((1, 4, 8)).astype(np.float32)
    test = ref.copy()
    test[0, 1, 2] = np.nan
    assert not array_metrics(test, ref).finite
    result = judge(
        "layers.0.x1", test, ref, num_layers=2, tolerance=TOLERANCES["float32"], test_label="torch", ref_label="jax"
    )
    assert not result.passed and "non-finite" in result.reason and "torch" in result.reason


def test_shape_mismatch_and_missing_component_fail():
    tol = TOLERANCES["float32"]
    a = np.zeros((1, 2, 3), np.float32)
    assert "shape" in judge("embed", a, np.zeros((1, 2, 4), np.float32), num_layers=1, tolerance=tol).reason
    result = judge("embed", None, a, num_layers=1, tolerance=tol, test_label="jax")
    assert not result.passed and "not traced by jax" in result.reason


def test_logits_kl_and_top1():
    ref = RNG.standard_normal((2, 3, 11)).astype(np.float32)
    same = logits_metrics(ref, ref.copy())
    assert same.kl_max == pytest.approx(0.0, abs=1e-12) and same.top1 == 1.0
    flipped = ref.copy()
    flipped[0, 0] = -flipped[0, 0]  # a different distribution (and top-1) at one position
    m = logits_metrics(flipped, ref)
    assert m.kl_max > 0.1 and m.top1 == pytest.approx(5 / 6)
    # KL(p_ref || p_test) in closed form for one position
    p, q = np.exp(ref[0, 0] - ref[0, 0].max()), np.exp(flipped[0, 0] - flipped[0, 0].max())
    p, q = p / p.sum(), q / q.sum()
    assert m.kl_max == pytest.approx(float((p * np.log(p / q)).sum()), rel=1e-5)


def test_tolerance_table_has_a_reason_for_every_number():
    assert set(TOLERANCES) == {"float32", "bfloat16", "float16"}
    for tol in TOLERANCES.values():
        assert len(tol.max_rel_reason) > 40 and len(tol.rms_rel_reason) > 20
        assert tol.dtype in describe(tol)
    assert TOLERANCES["bfloat16"].max_rel == 8 * 2.0**-8 and TOLERANCES["float16"].max_rel == 8 * 2.0**-11
    with pytest.raises(InputError, match="int8"):
        tolerance_for("int8")


def test_bounds_grow_with_depth():
    tol = TOLERANCES["bfloat16"]
    assert tol.bound(0).max_rel == tol.max_rel
    assert tol.bound(3).max_rel == pytest.approx(2 * tol.max_rel)
    assert 1 - tol.bound(3).min_cosine == pytest.approx(4 * (1 - tol.bound(0).min_cosine))
    assert tol.bound(0).kl_max(10.0) == pytest.approx(0.5 * (tol.rms_rel * 10.0) ** 2)


def test_component_order_and_depths():
    names = component_order(2)
    assert names[0] == "embed" and names[-2:] == ["final_norm", "logits"] and len(names) == 2 + 2 * 10 + 1
    assert names.index("layers.0.attn.q") < names.index("layers.0.attn_out") < names.index("layers.0.x1")
    assert [layers_before(n, 2) for n in ("embed", "layers.0.x2", "layers.1.attn.k", "logits")] == [0, 0, 1, 2]
    assert hf_components(3) == ["embed", "layers.0.x2", "layers.1.x2", "final_norm", "logits"]
    assert residual_stream(1) == ["layers.0.x1", "layers.0.x2", "logits"]


def _traces(num_layers: int = 2) -> tuple[dict, dict]:
    ref = {}
    for name in component_order(num_layers):
        shape = (1, 3, 17) if name == "logits" else (1, 3, 8)
        ref[name] = RNG.standard_normal(shape).astype(np.float32)
    return {k: v.copy() for k, v in ref.items()}, ref


def test_first_failure_is_first_in_forward_order_not_in_dict_order():
    test, ref = _traces()
    test["layers.1.x2"] += 1.0
    test["layers.0.mlp.act"] += 1.0
    test = dict(sorted(test.items()))  # JAX returns its trace sorted by name: 'layers.0.mlp.act' sorts late
    comparison = compare_traces(test, ref, component_order(2), num_layers=2, tolerance=TOLERANCES["float32"])
    assert not comparison.passed and comparison.first_failure.name == "layers.0.mlp.act"
    assert [r.name for r in comparison.results if not r.passed] == ["layers.0.mlp.act", "layers.1.x2"]


def _report(comparisons) -> Report:
    spec_dict = DEFAULT_SPEC.to_dict()
    return Report(
        checkpoint="ckpt",
        model=spec_dict,
        dtype="float32",
        kernels={"torch": "reference"},
        reference=None,
        input_shape=(1, 3),
        tolerance=TOLERANCES["float32"],
        comparisons=comparisons,
    )


def test_report_text_and_json():
    test, ref = _traces()
    test["layers.1.attn_out"][0, 0, 0] = np.inf
    comparison = compare_traces(
        test,
        ref,
        component_order(2),
        num_layers=2,
        tolerance=TOLERANCES["float32"],
        test_label="torch",
        ref_label="jax",
    )
    report = _report([comparison])
    assert not report.passed and report.first_divergence == "layers.1.attn_out"
    text = report.format()
    assert "FAIL <- first" in text and "first divergence at layers.1.attn_out (torch vs jax)" in text
    data = json.loads(report.to_json())  # strict JSON: no NaN or Infinity literals
    assert data["first_divergence"] == "layers.1.attn_out" and data["passed"] is False
    row = next(c for c in data["comparisons"][0]["components"] if c["name"] == "layers.1.attn_out")
    assert row["metrics"]["max_rel"] == "inf" and row["metrics"]["cosine"] is None
    assert data["tolerance"]["max_rel_reason"]


def test_report_picks_the_earliest_failure_across_comparisons():
    test, ref = _traces()
    late = compare_traces(
        {**test, "logits": test["logits"] + 5},
        ref,
        component_order(2),
        num_layers=2,
        tolerance=TOLERANCES["float32"],
        test_label="torch",
        ref_label="jax",
    )
    early_test = {**test, "layers.0.x2": test["layers.0.x2"] + 1}
    early = compare_traces(
        early_test,
        ref,
        hf_components(2),
        num_layers=2,
        tolerance=TOLERANCES["float32"],
        test_label="torch",
        ref_label="hf",
    )
    report = _report([late, early])
    assert report.first_divergence == "layers.0.x2" and "(torch vs hf)" in report.verdict_line()
    assert math.isfinite(report.comparison("torch", "jax").result("logits").metrics.max_rel)


def test_plot_of_a_float32_report_with_a_failure(tmp_path):
    """float32 has no float32 baseline to draw: the plot shows the cross-backend error, tolerance, divergence."""
    from parity.plot import plot_report

    test, ref = _traces()
    test["layers.1.x1"] += 1.0
    comparison = compare_traces(test, ref, component_order(2), num_layers=2, tolerance=TOLERANCES["float32"])
    path = plot_report(_report([comparison]), tmp_path / "residual.svg")
    assert path.read_text().lstrip().startswith("<?xml")
    with pytest.raises(InputError, match="cannot write the plot"):
        plot_report(_report([comparison]), tmp_path / "residual.unknown-format")
