"""Each framework's fused kernels against its own references: one set of cases, run for Triton and for Pallas.

What only one framework has (torch autograd and strides, Triton's compiler; jax.jit and jax.grad, Pallas'
GPU lowering) is tested in test_triton_kernels.py and test_pallas_kernels.py; Triton against Pallas in
test_cross_kernels.py. On CPU both run interpreted (Triton's interpreter; Pallas' interpret=True), which is
slow, and each new shape costs Pallas an XLA compile: row counts stay small except for the narrowest widths.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.backends import to_numpy
from tests.kernels.frameworks import DTYPES, EPS, FRAMEWORKS, WIDTHS, Framework, framework
from tests.kernels.tolerances import assert_within_tolerance, sample_inputs

ROWS = (1, 3, 17)


@pytest.fixture(scope="module", params=FRAMEWORKS)
def fw(request: pytest.FixtureRequest) -> Framework:
    return framework(request.param)


def _check_add_rms_norm(
    fw: Framework, shape: tuple[int, ...], dtype: str, with_residual: bool, prefixes: tuple[int, ...] = ()
) -> None:
    """Fused vs reference on `shape`, and on its first `prefixes` rows against the same reference rows.

    The op is row-wise, so one reference call serves every row count (in JAX: one compile, not three).
    """
    x, residual = sample_inputs(shape, 0, "x"), sample_inputs(shape, 1, "residual") if with_residual else None
    weight = fw.array(sample_inputs(shape[-1:], 2, "weight"), dtype)
    want = fw.add_rms_norm_reference(
        fw.array(x, dtype), fw.array(residual, dtype) if with_residual else None, weight, EPS
    )
    want = [to_numpy(w) for w in want] if with_residual else [to_numpy(want)]
    for n in (*prefixes, shape[0]):
        got = fw.add_rms_norm(
            fw.array(x[:n], dtype), fw.array(residual[:n], dtype) if with_residual else None, weight, EPS
        )
        got = got if with_residual else (got,)
        assert all(g.shape == (n, *shape[1:]) and g.dtype == weight.dtype for g in got)
        for g, w, quantity in zip(got, want, ("add_rms_norm", "new_residual")[: len(got)], strict=True):
            assert_within_tolerance(to_numpy(g), w[:n], quantity, dtype, str((n, *shape[1:])))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm(fw: Framework, dtype: str, width: int) -> None:
    _check_add_rms_norm(fw, (ROWS[-1], width), dtype, with_residual=True, prefixes=ROWS[:-1])
    _check_add_rms_norm(fw, (3, width), dtype, with_residual=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_many_rows(fw: Framework, dtype: str) -> None:
    _check_add_rms_norm(fw, (257, 1), dtype, with_residual=True)
    _check_add_rms_norm(fw, (257, 123), dtype, with_residual=True)
    _check_add_rms_norm(fw, (257, 123), dtype, with_residual=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_wide_rows(fw: Framework, dtype: str) -> None:
    _check_add_rms_norm(fw, (2, 9728), dtype, with_residual=True)  # Qwen3-4B's intermediate width


def test_add_rms_norm_3d_and_4d(fw: Framework) -> None:
    _check_add_rms_norm(fw, (2, 5, 896), "bfloat16", with_residual=True)  # [batch, seq, H]
    _check_add_rms_norm(fw, (1, 2, 4, 128), "bfloat16", with_residual=False)  # per-head q/k norm: [b, s, heads, d]


@pytest.mark.parametrize("width", [*WIDTHS, 9728])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(fw: Framework, dtype: str, width: int) -> None:
    x = sample_inputs((ROWS[-1], 2 * width), 7, "gate_up")
    want = to_numpy(fw.silu_and_mul_reference(fw.array(x, dtype)))  # row-wise: its first rows serve fewer rows
    for n in ROWS:
        got = fw.silu_and_mul(fw.array(x[:n], dtype))
        assert got.shape == (n, width) and str(got.dtype).endswith(dtype)
        assert_within_tolerance(to_numpy(got), want[:n], "silu_and_mul", dtype, str((n, 2 * width)))


def test_silu_and_mul_many_rows_and_3d(fw: Framework) -> None:
    for shape in [(300, 2 * 123), (2, 3, 2 * 896)]:
        x = fw.array(sample_inputs(shape, 8, "gate_up"), "bfloat16")
        got, want = fw.silu_and_mul(x), fw.silu_and_mul_reference(x)
        assert_within_tolerance(to_numpy(got), to_numpy(want), "silu_and_mul", "bfloat16", str(shape))


def test_known_answer(fw: Framework) -> None:
    x, weight = fw.array(np.array([[3.0, 4.0]], np.float32), "float32"), fw.array(np.ones(2, np.float32), "float32")
    np.testing.assert_allclose(to_numpy(fw.add_rms_norm(x, None, weight, 1e-12)), [[0.8485281, 1.1313709]], rtol=1e-6)


def test_empty_input(fw: Framework) -> None:
    x = fw.array(np.zeros((0, 64), np.float32), "float32")
    out, new_residual = fw.add_rms_norm(x, x, fw.array(np.ones(64, np.float32), "float32"), EPS)
    assert out.shape == new_residual.shape == (0, 64)
    assert fw.silu_and_mul(fw.array(np.zeros((2, 0, 8), np.float32), "float32")).shape == (2, 0, 4)


def _bad_call(fw: Framework, case: str, arn, sam):
    def ones(shape: tuple[int, ...], dtype: str = "float32"):
        return fw.array(np.ones(shape, np.float32), dtype)

    x, w = ones((2, 8)), ones((8,))
    return {
        "residual shape": lambda: arn(x, ones((2, 9)), w, EPS),
        "residual dtype": lambda: arn(x, ones((2, 8), "float16"), w, EPS),
        "weight length": lambda: arn(x, None, ones((9,)), EPS),
        "weight dtype": lambda: arn(x, None, ones((8,), "float16"), EPS),
        "eps zero": lambda: arn(x, None, w, 0.0),
        "eps negative": lambda: arn(x, None, w, -1e-6),
        "int": lambda: sam(ones((2, 8), "int32")),
        "odd width": lambda: sam(ones((2, 7))),
    }[case]


# {p} is the framework's dtype prefix ("torch." / ""); float64 is Triton's alone (test_triton_kernels.py):
# JAX makes float32 of it unless jax_enable_x64 is set.
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("residual shape", r"residual has shape \(2, 9\) but x has shape \(2, 8\)"),
        ("residual dtype", r"residual has dtype {p}float16 but x has dtype {p}float32"),
        ("weight length", r"weight has shape \(9,\), expected \(8,\)"),
        ("weight dtype", r"weight has dtype {p}float16"),
        ("eps zero", r"eps must be a finite Python float > 0, got 0.0"),
        ("eps negative", r"eps must be"),
        ("int", r"x has dtype {p}int32; supported dtypes are float32, bfloat16, float16"),
        ("odd width", r"even last dim >= 2, got \(2, 7\)"),
    ],
)
def test_errors_name_the_argument(fw: Framework, case: str, message: str) -> None:
    # The fused path and the reference refuse exactly the same calls, with the same words.
    message = message.replace("{p}", fw.dtype_prefix)
    with pytest.raises((ValueError, TypeError), match=message):
        _bad_call(fw, case, fw.add_rms_norm, fw.silu_and_mul)()
    with pytest.raises((ValueError, TypeError), match=message):
        _bad_call(fw, case, fw.ops.add_rms_norm_reference, fw.ops.silu_and_mul_reference)()


@pytest.mark.parametrize("width", [1, 2, 123, 896, 1000, 1024, 1536, 3072, 4096, 9728, 65536])
def test_block_config_obeys_gpu_rules(fw: Framework, width: int) -> None:
    cfg = fw.rms_norm._block_config(width)
    assert cfg["BLOCK_H"] >= width and cfg["BLOCK_H"] < 2 * width + 1
    for n in (cfg["BLOCK_H"], cfg["BLOCK_ROWS"], cfg["num_warps"]):
        assert n & (n - 1) == 0, cfg  # tl.arange (Pallas: its GPU lowering) and the warp count need powers of two
    assert 1 <= cfg["num_warps"] <= 32 and cfg["BLOCK_ROWS"] * cfg["BLOCK_H"] <= fw.rms_norm.MAX_BLOCK_H
    cfg = fw.swiglu._block_config(width)
    assert cfg["BLOCK_COLS"] <= 1024 and (cfg["BLOCK_COLS"] >= width or cfg["BLOCK_COLS"] == 1024)
    for n in (cfg["BLOCK_COLS"], cfg["BLOCK_ROWS"], cfg["num_warps"]):
        assert n & (n - 1) == 0, cfg
    assert 1 <= cfg["num_warps"] <= 8


def test_too_wide_rows_are_refused(fw: Framework) -> None:
    with pytest.raises(ValueError, match=r"row width 65537 needs a block of 131072.*kernels='reference'"):
        fw.rms_norm._block_config(65537)


def test_package_exposes_functions_even_after_submodule_import(fw: Framework) -> None:
    assert callable(fw.ops.add_rms_norm) and callable(fw.ops.silu_and_mul)
    assert fw.ops.add_rms_norm is fw.rms_norm.add_rms_norm
