"""The compiled kernels on a GPU against their references, to the kernel tolerance table.

The CPU suite (tests/kernels) runs the same kernel source in interpret mode; these tests check what a GPU
actually compiles: Triton's code generation and Pallas' Triton lowering, the GPU's exp and rsqrt, the real
block sizes and grids of thousands of programs. Shapes: one row (a decode step) and 4099 rows (many programs
and a ragged last block) at widths 1, 1000 (no power of two, nor a multiple of 16), 4096 and 9728 (real model
widths), with and without the residual. Issue 15's family kernels (add_rms_norm with Gemma's and OLMo 2's options,
gelu_tanh_and_mul) on the same shapes. Bounds: tests/kernels/tolerances.py, the table the CPU tests apply.
"""

from __future__ import annotations

import functools
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from tests.kernels import gradients, tolerances
from tests.kernels.tolerances import assert_within_tolerance

pytestmark = pytest.mark.gpu

DTYPES = ("float32", "bfloat16", "float16")
WIDTHS = (1, 1000, 4096, 9728)
ROWS = (1, 4099)  # each prefix of the same data, against the same reference rows
NO_RESIDUAL_ROWS = 5
EPS = 1e-6

NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# add_rms_norm's family options (name, offset, float32_weight) and the bound each is held to.
FAMILIES = [("gemma", 1.0, True), ("olmo2", 0.0, True), ("offset_only", 1.0, False)]
FAMILY_WIDTHS = (1000, 9728)

# Drawn once per process and never written: at 4099 x 2 * 9728 one draw costs the host seconds, and ~90 cases
# share a handful of arrays, inside gpu_check.sh's time budget.
sample_inputs = functools.cache(tolerances.sample_inputs)


@functools.cache
def _term_scale(width: int, dtype: str) -> np.ndarray:
    """gelu_tanh_and_mul's term scale of the gate_up sample of `width` (tests/kernels/gradients.py)."""
    return gradients.gelu_tanh_and_mul_term_scale(sample_inputs((ROWS[-1], 2 * width), 3, "gate_up"), dtype)


def _family_quantity(float32_weight: bool) -> str:
    return "add_rms_norm_float32_weight" if float32_weight else "add_rms_norm"


def _family_inputs(width: int, offset: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As _inputs, with the weight as a checkpoint of the family stores it (around 0 when applied as 1 + w)."""
    x, residual, weight = _inputs(width)
    return x, residual, weight - np.float32(offset)


def _inputs(width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = ROWS[-1]
    x, residual = sample_inputs((rows, width), 0, "x"), sample_inputs((rows, width), 1, "residual")
    return x, residual, sample_inputs((width,), 2, "weight")


# ---- Triton (torch) -------------------------------------------------------------------------------------------
def _cuda(a: np.ndarray, dtype: str) -> Any:
    import torch

    return torch.from_numpy(a).to(device="cuda", dtype=getattr(torch, dtype))


def _host(t: Any) -> np.ndarray:
    return t.float().cpu().numpy()


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_add_rms_norm(triton_compiled: None, dtype: str, width: int) -> None:
    from kernels.triton import add_rms_norm, add_rms_norm_reference

    x, residual, weight = (_cuda(a, dtype) for a in _inputs(width))
    want_out, want_residual = (_host(t) for t in add_rms_norm_reference(x, residual, weight, EPS))
    for n in ROWS:
        out, new_residual = add_rms_norm(x[:n], residual[:n], weight, EPS)
        assert out.is_cuda and out.dtype == x.dtype and out.shape == (n, width)
        assert_within_tolerance(_host(out), want_out[:n], "add_rms_norm", dtype, f"triton [{n}, {width}]")
        assert_within_tolerance(_host(new_residual), want_residual[:n], "new_residual", dtype, f"triton [{n}]")
    x5 = x[:NO_RESIDUAL_ROWS]
    want = _host(add_rms_norm_reference(x5, None, weight, EPS))
    assert_within_tolerance(_host(add_rms_norm(x5, None, weight, EPS)), want, "add_rms_norm", dtype, "no residual")


def test_triton_add_rms_norm_reads_row_strided_views(triton_compiled: None) -> None:
    """Column slices of wider tensors (row stride 2H) are read through their stride, as the model passes them."""
    from kernels.triton import add_rms_norm, add_rms_norm_reference

    x, residual, weight = (_cuda(a, "bfloat16") for a in _inputs(4096))
    wide_x, wide_residual = (t.repeat(1, 2) for t in (x, residual))  # [rows, 2H]
    views = wide_x[:, 4096:], wide_residual[:, :4096]
    assert views[0].stride(0) == 2 * 4096 and not views[0].is_contiguous()
    got = add_rms_norm(*views, weight, EPS)
    want = add_rms_norm_reference(x, residual, weight, EPS)
    for g, w, quantity in zip(got, want, ("add_rms_norm", "new_residual"), strict=True):
        assert_within_tolerance(_host(g), _host(w), quantity, "bfloat16", "row-strided views")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_silu_and_mul(triton_compiled: None, dtype: str, width: int) -> None:
    from kernels.triton import silu_and_mul, silu_and_mul_reference

    gate_up = _cuda(sample_inputs((ROWS[-1], 2 * width), 3, "gate_up"), dtype)  # [rows, 2I], gate first
    want = _host(silu_and_mul_reference(gate_up))
    for n in ROWS:
        out = silu_and_mul(gate_up[:n])
        assert out.is_cuda and out.dtype == gate_up.dtype and out.shape == (n, width)
        assert_within_tolerance(_host(out), want[:n], "silu_and_mul", dtype, f"triton [{n}, {width}]")


@pytest.mark.parametrize(("family", "offset", "float32_weight"), FAMILIES)
@pytest.mark.parametrize("width", FAMILY_WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_add_rms_norm_family(
    triton_compiled: None, dtype: str, width: int, family: str, offset: float, float32_weight: bool
) -> None:
    from kernels.triton import add_rms_norm, add_rms_norm_reference

    options = {"offset": offset, "float32_weight": float32_weight}
    x, residual, weight = (_cuda(a, dtype) for a in _family_inputs(width, offset))
    want_out, want_residual = (_host(t) for t in add_rms_norm_reference(x, residual, weight, EPS, **options))
    quantity = _family_quantity(float32_weight)
    for n in ROWS:
        out, new_residual = add_rms_norm(x[:n], residual[:n], weight, EPS, **options)
        assert_within_tolerance(_host(out), want_out[:n], quantity, dtype, f"triton {family} [{n}, {width}]")
        assert_within_tolerance(_host(new_residual), want_residual[:n], "new_residual", dtype, f"triton {family}")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_gelu_tanh_and_mul(triton_compiled: None, dtype: str, width: int) -> None:
    from kernels.triton import gelu_tanh_and_mul, gelu_tanh_and_mul_reference

    data = sample_inputs((ROWS[-1], 2 * width), 3, "gate_up")  # [rows, 2I], gate first
    gate_up, scale = _cuda(data, dtype), _term_scale(width, dtype)
    want = _host(gelu_tanh_and_mul_reference(gate_up))
    for n in ROWS:
        out = gelu_tanh_and_mul(gate_up[:n])
        assert out.is_cuda and out.dtype == gate_up.dtype and out.shape == (n, width)
        what = f"triton [{n}, {width}]"
        assert_within_tolerance(_host(out), want[:n], "gelu_tanh_and_mul", dtype, what, scale[:n])


# ---- Pallas (JAX) ---------------------------------------------------------------------------------------------
def _on(device: Any, a: np.ndarray, dtype: str) -> Any:
    import jax

    return jax.device_put(a.astype(NUMPY_DTYPES[dtype]), device)  # cast in numpy: round-to-nearest-even


def _np(a: Any) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pallas_add_rms_norm(jax_gpu: Any, dtype: str, width: int) -> None:
    import jax

    from kernels.pallas import add_rms_norm, add_rms_norm_reference

    reference = jax.jit(add_rms_norm_reference, static_argnums=3)
    x, residual, weight = (_on(jax_gpu, a, dtype) for a in _inputs(width))
    want_out, want_residual = (_np(a) for a in reference(x, residual, weight, EPS))
    for n in ROWS:
        out, new_residual = add_rms_norm(x[:n], residual[:n], weight, EPS, interpret=False)  # compiled, always
        assert out.devices() == {jax_gpu} and out.dtype == x.dtype and out.shape == (n, width)
        assert_within_tolerance(_np(out), want_out[:n], "add_rms_norm", dtype, f"pallas [{n}, {width}]")
        assert_within_tolerance(_np(new_residual), want_residual[:n], "new_residual", dtype, f"pallas [{n}]")
    x5 = x[:NO_RESIDUAL_ROWS]
    got = add_rms_norm(x5, None, weight, EPS, interpret=False)
    assert_within_tolerance(_np(got), _np(reference(x5, None, weight, EPS)), "add_rms_norm", dtype, "no residual")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pallas_silu_and_mul(jax_gpu: Any, dtype: str, width: int) -> None:
    import jax

    from kernels.pallas import silu_and_mul, silu_and_mul_reference

    gate_up = _on(jax_gpu, sample_inputs((ROWS[-1], 2 * width), 3, "gate_up"), dtype)  # [rows, 2I], gate first
    want = _np(jax.jit(silu_and_mul_reference)(gate_up))
    for n in ROWS:
        out = silu_and_mul(gate_up[:n], interpret=False)
        assert out.devices() == {jax_gpu} and out.dtype == gate_up.dtype and out.shape == (n, width)
        assert_within_tolerance(_np(out), want[:n], "silu_and_mul", dtype, f"pallas [{n}, {width}]")


@pytest.mark.parametrize(("family", "offset", "float32_weight"), FAMILIES)
@pytest.mark.parametrize("width", FAMILY_WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pallas_add_rms_norm_family(
    jax_gpu: Any, dtype: str, width: int, family: str, offset: float, float32_weight: bool
) -> None:
    import functools

    import jax

    from kernels.pallas import add_rms_norm, add_rms_norm_reference

    options = {"offset": offset, "float32_weight": float32_weight}
    reference = jax.jit(functools.partial(add_rms_norm_reference, **options), static_argnums=3)
    x, residual, weight = (_on(jax_gpu, a, dtype) for a in _family_inputs(width, offset))
    want_out, want_residual = (_np(a) for a in reference(x, residual, weight, EPS))
    quantity = _family_quantity(float32_weight)
    for n in ROWS:
        out, new_residual = add_rms_norm(x[:n], residual[:n], weight, EPS, **options, interpret=False)
        assert out.devices() == {jax_gpu}
        assert_within_tolerance(_np(out), want_out[:n], quantity, dtype, f"pallas {family} [{n}, {width}]")
        assert_within_tolerance(_np(new_residual), want_residual[:n], "new_residual", dtype, f"pallas {family}")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pallas_gelu_tanh_and_mul(jax_gpu: Any, dtype: str, width: int) -> None:
    import jax

    from kernels.pallas import gelu_tanh_and_mul, gelu_tanh_and_mul_reference

    data = sample_inputs((ROWS[-1], 2 * width), 3, "gate_up")  # [rows, 2I], gate first
    gate_up, scale = _on(jax_gpu, data, dtype), _term_scale(width, dtype)
    want = _np(jax.jit(gelu_tanh_and_mul_reference)(gate_up))
    for n in ROWS:
        out = gelu_tanh_and_mul(gate_up[:n], interpret=False)
        assert out.devices() == {jax_gpu} and out.dtype == gate_up.dtype and out.shape == (n, width)
        what = f"pallas [{n}, {width}]"
        assert_within_tolerance(_np(out), want[:n], "gelu_tanh_and_mul", dtype, what, scale[:n])


def test_pallas_add_rms_norm_inside_jit_compiles_for_the_gpu(jax_gpu: Any) -> None:
    """Under jax.jit (as jax_impl calls it) the platform decides at lowering time: compiled on the GPU."""
    import jax

    from kernels.pallas import add_rms_norm, add_rms_norm_reference

    x, residual, weight = (_on(jax_gpu, a, "bfloat16") for a in _inputs(4096))
    got = jax.jit(lambda x, r, w: add_rms_norm(x, r, w, EPS))(x, residual, weight)
    want = add_rms_norm_reference(x, residual, weight, EPS)
    for g, w, quantity in zip(got, want, ("add_rms_norm", "new_residual"), strict=True):
        assert_within_tolerance(_np(g), _np(w), quantity, "bfloat16", "under jax.jit")
    lowered = jax.jit(lambda x, r, w: add_rms_norm(x, r, w, EPS)).lower(x, residual, weight).as_text()
    assert "triton" in lowered.lower(), "the jitted kernel did not lower to a Triton call on the GPU"


# ---- across frameworks ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_and_pallas_agree_on_the_gpu(triton_compiled: None, jax_gpu: Any, dtype: str) -> None:
    """The two compiled kernels on the same data, to the same bounds as each against its own reference."""
    from kernels.pallas import add_rms_norm as pallas_add_rms_norm
    from kernels.pallas import silu_and_mul as pallas_silu_and_mul
    from kernels.triton import add_rms_norm as triton_add_rms_norm
    from kernels.triton import silu_and_mul as triton_silu_and_mul

    arrays = _inputs(4096)
    triton_out = triton_add_rms_norm(*(_cuda(a, dtype) for a in arrays), EPS)
    pallas_out = pallas_add_rms_norm(*(_on(jax_gpu, a, dtype) for a in arrays), EPS, interpret=False)
    for t, p, quantity in zip(triton_out, pallas_out, ("add_rms_norm", "new_residual"), strict=True):
        assert_within_tolerance(_host(t), _np(p), quantity, dtype, "triton vs pallas")
    gate_up = sample_inputs((ROWS[-1], 2 * 4096), 3, "gate_up")
    triton_act = _host(triton_silu_and_mul(_cuda(gate_up, dtype)))
    pallas_act = _np(pallas_silu_and_mul(_on(jax_gpu, gate_up, dtype), interpret=False))
    assert_within_tolerance(triton_act, pallas_act, "silu_and_mul", dtype, "triton vs pallas")


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_and_pallas_family_kernels_agree_on_the_gpu(triton_compiled: None, jax_gpu: Any, dtype: str) -> None:
    """Gemma's add_rms_norm and GeGLU, compiled in both frameworks on the same data."""
    import kernels.pallas as pallas
    import kernels.triton as triton

    arrays, options = _family_inputs(4096, 1.0), {"offset": 1.0, "float32_weight": True}
    triton_out = triton.add_rms_norm(*(_cuda(a, dtype) for a in arrays), EPS, **options)
    pallas_out = pallas.add_rms_norm(*(_on(jax_gpu, a, dtype) for a in arrays), EPS, **options, interpret=False)
    for t, p, quantity in zip(triton_out, pallas_out, ("add_rms_norm_float32_weight", "new_residual"), strict=True):
        assert_within_tolerance(_host(t), _np(p), quantity, dtype, "gemma: triton vs pallas")
    gate_up = sample_inputs((ROWS[-1], 2 * 4096), 3, "gate_up")
    triton_act = _host(triton.gelu_tanh_and_mul(_cuda(gate_up, dtype)))
    pallas_act = _np(pallas.gelu_tanh_and_mul(_on(jax_gpu, gate_up, dtype), interpret=False))
    scale = _term_scale(4096, dtype)
    assert_within_tolerance(triton_act, pallas_act, "gelu_tanh_and_mul", dtype, "triton vs pallas", scale)
