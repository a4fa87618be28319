"""Pallas kernels (kernels/pallas/) against their JAX references; twin of test_triton_kernels.py.

On CPU the kernels run with interpret=True (chosen per call from the platform, no environment variable);
each new shape costs an XLA compile of the interpreted grid loop, so the matrix stays lean. The GPU
lowering itself (power-of-two blocks, masked loads, the residual alias) is checked without a GPU by
lowering for "cuda" (test_kernels_lower_for_gpu).
"""

from __future__ import annotations

import functools
import importlib

import ml_dtypes
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from kernels.pallas import add_rms_norm, add_rms_norm_reference, silu_and_mul, silu_and_mul_reference  # noqa: E402
from tests.kernels.tolerances import assert_within_tolerance, sample_inputs  # noqa: E402

arn_module = importlib.import_module("kernels.pallas.rms_norm")
sam_module = importlib.import_module("kernels.pallas.swiglu")

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
WIDTHS = (1, 123, 1000, 896, 1024, 1536, 3072)
ROWS = (1, 3, 17)
EPS = 1e-6

# The references under jax.jit: one XLA compile per shape instead of one per op (eager), which is most of
# this module's run time otherwise; jax_impl runs them jitted too.
reference_add_rms_norm = jax.jit(add_rms_norm_reference, static_argnums=3)
reference_silu_and_mul = jax.jit(silu_and_mul_reference)


# Casts happen in numpy (ml_dtypes rounds to nearest-even, like torch and XLA): an eager jnp cast would
# cost an XLA compile per shape.
def _j(a: np.ndarray, dtype: str) -> jax.Array:
    return jnp.asarray(a.astype(DTYPES[dtype]))


def _np(a: jax.Array) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


def _check_add_rms_norm(
    shape: tuple[int, ...], dtype: str, with_residual: bool, prefixes: tuple[int, ...] = ()
) -> None:
    """Fused vs reference on `shape`, and on its first `prefixes` rows against the same reference rows.

    The op is row-wise, so one reference call serves every row count (in JAX: one compile, not three).
    """
    x, residual = sample_inputs(shape, 0, "x"), sample_inputs(shape, 1, "residual") if with_residual else None
    weight = _j(sample_inputs(shape[-1:], 2, "weight"), dtype)
    want = reference_add_rms_norm(_j(x, dtype), _j(residual, dtype) if with_residual else None, weight, EPS)
    want = [_np(w) for w in want] if with_residual else [_np(want)]
    for n in (*prefixes, shape[0]):
        got = add_rms_norm(_j(x[:n], dtype), _j(residual[:n], dtype) if with_residual else None, weight, EPS)
        got = got if with_residual else (got,)
        assert all(g.shape == (n, *shape[1:]) and g.dtype == weight.dtype for g in got)
        for g, w, quantity in zip(got, want, ("add_rms_norm", "new_residual")[: len(got)], strict=True):
            assert_within_tolerance(_np(g), w[:n], quantity, dtype, str((n, *shape[1:])))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm(dtype: str, width: int) -> None:
    _check_add_rms_norm((ROWS[-1], width), dtype, with_residual=True, prefixes=ROWS[:-1])
    _check_add_rms_norm((3, width), dtype, with_residual=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_many_rows(dtype: str) -> None:
    _check_add_rms_norm((257, 1), dtype, with_residual=True)
    _check_add_rms_norm((257, 123), dtype, with_residual=True)
    _check_add_rms_norm((257, 123), dtype, with_residual=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_wide_rows(dtype: str) -> None:
    _check_add_rms_norm((2, 9728), dtype, with_residual=True)  # Qwen3-4B's intermediate width


def test_add_rms_norm_3d_and_4d() -> None:
    _check_add_rms_norm((2, 5, 896), "bfloat16", with_residual=True)  # [batch, seq, H]
    _check_add_rms_norm((1, 2, 4, 128), "bfloat16", with_residual=False)  # per-head q/k norm: [b, s, heads, head_dim]


@pytest.mark.parametrize("width", [*WIDTHS, 9728])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype: str, width: int) -> None:
    x = sample_inputs((ROWS[-1], 2 * width), 7, "gate_up")
    want = _np(reference_silu_and_mul(_j(x, dtype)))  # row-wise: its first rows serve the smaller row counts
    for n in ROWS:
        got = silu_and_mul(_j(x[:n], dtype))
        assert got.shape == (n, width) and str(got.dtype).endswith(dtype)
        assert_within_tolerance(_np(got), want[:n], "silu_and_mul", dtype, str((n, 2 * width)))


def test_silu_and_mul_many_rows_and_3d() -> None:
    for shape in [(300, 2 * 123), (2, 3, 2 * 896)]:
        x = _j(sample_inputs(shape, 8, "gate_up"), "bfloat16")
        assert_within_tolerance(
            _np(silu_and_mul(x)), _np(reference_silu_and_mul(x)), "silu_and_mul", "bfloat16", str(shape)
        )


def test_known_answer() -> None:
    out = add_rms_norm(jnp.array([[3.0, 4.0]]), None, jnp.ones(2), 1e-12)
    np.testing.assert_allclose(_np(out), [[0.8485281, 1.1313709]], rtol=1e-6)


def test_inside_jit_and_functional() -> None:
    x, residual = _j(sample_inputs((3, 64), 0, "x"), "bfloat16"), _j(sample_inputs((3, 64), 1, "residual"), "bfloat16")
    weight = _j(sample_inputs((64,), 2, "weight"), "bfloat16")
    residual0 = np.asarray(residual)
    step = jax.jit(lambda x, r, w: add_rms_norm(x, r, w, EPS))  # tracers: the platform is chosen at lowering
    (out, new_residual), (want, want_residual) = (
        step(x, residual, weight),
        add_rms_norm_reference(x, residual, weight, EPS),
    )
    assert_within_tolerance(_np(out), _np(want), "add_rms_norm", "bfloat16", "jit")
    assert_within_tolerance(_np(new_residual), _np(want_residual), "new_residual", "bfloat16", "jit")
    np.testing.assert_array_equal(np.asarray(residual), residual0)  # the alias never clobbers a live input


def test_empty_input() -> None:
    x = jnp.zeros((0, 64))
    out, new_residual = add_rms_norm(x, x, jnp.ones(64), EPS)
    assert out.shape == new_residual.shape == (0, 64)
    assert silu_and_mul(jnp.zeros((2, 0, 8))).shape == (2, 0, 4)


@pytest.mark.parametrize(("dtype", "with_residual"), [("float32", True), ("bfloat16", False)])
def test_add_rms_norm_gradients_match_reference(dtype: str, with_residual: bool) -> None:
    x, residual = _j(sample_inputs((3, 123), 0, "x"), dtype), _j(sample_inputs((3, 123), 1, "residual"), dtype)
    weight = _j(sample_inputs((123,), 2, "weight"), dtype)
    ramp = jnp.linspace(-1.0, 1.0, 123)

    def loss(fn, x, residual, weight):
        outs = fn(x, residual if with_residual else None, weight, EPS)
        outs = outs if isinstance(outs, tuple) else (outs,)
        # Use every output, with different cotangents, so both outputs' gradients are checked.
        return sum(jnp.sum(o.astype(jnp.float32) * (k + 1) * ramp) for k, o in enumerate(outs))

    got = jax.grad(functools.partial(loss, add_rms_norm), argnums=(0, 1, 2))(x, residual, weight)
    want = jax.grad(functools.partial(loss, add_rms_norm_reference), argnums=(0, 1, 2))(x, residual, weight)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(_np(g), _np(w))  # backward *is* the reference's backward


def test_silu_and_mul_gradient_matches_reference() -> None:
    x, ramp = _j(sample_inputs((3, 246), 0, "gate_up"), "float32"), jnp.linspace(-1.0, 1.0, 123)
    got = jax.grad(lambda x: jnp.sum(silu_and_mul(x) * ramp))(x)
    want = jax.grad(lambda x: jnp.sum(silu_and_mul_reference(x) * ramp))(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _bad_call(case: str, arn, sam):
    x, w = jnp.ones((2, 8)), jnp.ones(8)
    return {
        "residual shape": lambda: arn(x, jnp.ones((2, 9)), w, EPS),
        "residual dtype": lambda: arn(x, x.astype(jnp.float16), w, EPS),
        "weight length": lambda: arn(x, None, jnp.ones(9), EPS),
        "weight dtype": lambda: arn(x, None, w.astype(jnp.float16), EPS),
        "eps zero": lambda: arn(x, None, w, 0.0),
        "eps negative": lambda: arn(x, None, w, -1e-6),
        "int": lambda: sam(jnp.ones((2, 8), jnp.int32)),
        "odd width": lambda: sam(jnp.ones((2, 7))),
    }[case]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("residual shape", r"residual has shape \(2, 9\) but x has shape \(2, 8\)"),
        ("residual dtype", r"residual has dtype float16 but x has dtype float32"),
        ("weight length", r"weight has shape \(9,\), expected \(8,\)"),
        ("weight dtype", r"weight has dtype float16"),
        ("eps zero", r"eps must be a finite Python float > 0, got 0.0"),
        ("eps negative", r"eps must be"),
        ("int", r"x has dtype int32; supported dtypes are float32, bfloat16, float16"),
        ("odd width", r"even last dim >= 2, got \(2, 7\)"),
    ],
)
def test_errors_name_the_argument(case: str, message: str) -> None:
    # The fused path and the reference refuse exactly the same calls, with the same words.
    with pytest.raises((ValueError, TypeError), match=message):
        _bad_call(case, add_rms_norm, silu_and_mul)()
    with pytest.raises((ValueError, TypeError), match=message):
        _bad_call(case, add_rms_norm_reference, silu_and_mul_reference)()


@pytest.mark.parametrize(("width", "dtype"), [(123, "bfloat16"), (9728, "float16"), (1, "float32")])
def test_kernels_lower_for_gpu(width: int, dtype: str) -> None:
    """Lower (not run) for CUDA: Pallas' Triton lowering rejects non-power-of-two blocks and unmasked tricks."""
    x, w = jnp.zeros((5, width), DTYPES[dtype]), jnp.zeros((width,), DTYPES[dtype])
    fused = jax.jit(lambda x, r, w: add_rms_norm(x, r, w, EPS))  # interpret=None: the platform decides
    text = fused.trace(x, x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in text
    assert "output_operand_aliases" in text  # the new residual may reuse the residual's buffer
    text = jax.jit(silu_and_mul).trace(jnp.zeros((5, 2 * width), DTYPES[dtype])).lower(lowering_platforms=("cuda",))
    assert "__gpu$xla.gpu.triton" in text.as_text()


@pytest.mark.parametrize("width", [1, 2, 123, 896, 1000, 1024, 1536, 3072, 4096, 9728, 65536])
def test_block_config_obeys_gpu_rules(width: int) -> None:
    cfg = arn_module._block_config(width)
    assert cfg["BLOCK_H"] >= width and cfg["BLOCK_H"] < 2 * width + 1
    for n in (cfg["BLOCK_H"], cfg["BLOCK_ROWS"], cfg["num_warps"]):
        assert n & (n - 1) == 0, cfg  # GPU lowering and the warp count need powers of two
    assert 1 <= cfg["num_warps"] <= 32 and cfg["BLOCK_ROWS"] * cfg["BLOCK_H"] <= arn_module.MAX_BLOCK_H
    cfg = sam_module._block_config(width)
    assert cfg["BLOCK_COLS"] <= 1024 and (cfg["BLOCK_COLS"] >= width or cfg["BLOCK_COLS"] == 1024)
    for n in (cfg["BLOCK_COLS"], cfg["BLOCK_ROWS"], cfg["num_warps"]):
        assert n & (n - 1) == 0, cfg
    assert 1 <= cfg["num_warps"] <= 8


def test_too_wide_rows_are_refused() -> None:
    with pytest.raises(ValueError, match=r"row width 65537 needs a block of 131072.*kernels='reference'"):
        arn_module._block_config(65537)


def test_package_exposes_functions_even_after_submodule_import() -> None:
    import kernels.pallas as package

    assert callable(package.add_rms_norm) and callable(package.silu_and_mul)
    assert package.add_rms_norm is arn_module.add_rms_norm
