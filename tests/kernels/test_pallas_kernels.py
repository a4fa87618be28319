"""Pallas kernels (kernels/pallas/): what only the JAX side has. The cases both frameworks share are in
test_kernels.py; this is the twin of test_triton_kernels.py.

JAX specifics: the kernels inside jax.jit (the platform is chosen at lowering) and functional (the residual
alias never clobbers a live input), and jax.grad outside jit. Pallas specifics: its GPU lowering, forward and
backward, checked without a GPU by lowering for "cuda" (test_kernels_lower_for_gpu,
test_backward_kernels_lower_for_gpu). On CPU the kernels run with interpret=True (chosen per
call from the platform, no environment variable); each new shape costs an XLA compile of the interpreted
grid loop, so the matrix stays lean.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.backends import to_numpy
from tests.kernels.frameworks import EPS, framework
from tests.kernels.gradients import add_rms_norm_term_scales, silu_and_mul_term_scale
from tests.kernels.tolerances import assert_within_tolerance, sample_inputs

PALLAS = framework("pallas")
jax = pytest.importorskip("jax")
jnp = jax.numpy

from kernels.pallas import add_rms_norm, add_rms_norm_reference, silu_and_mul, silu_and_mul_reference  # noqa: E402

_j = PALLAS.array


def test_inside_jit_and_functional() -> None:
    x, residual = _j(sample_inputs((3, 64), 0, "x"), "bfloat16"), _j(sample_inputs((3, 64), 1, "residual"), "bfloat16")
    weight = _j(sample_inputs((64,), 2, "weight"), "bfloat16")
    residual0 = np.asarray(residual)
    step = jax.jit(lambda x, r, w: add_rms_norm(x, r, w, EPS))  # tracers: the platform is chosen at lowering
    (out, new_residual), (want, want_residual) = (
        step(x, residual, weight),
        add_rms_norm_reference(x, residual, weight, EPS),
    )
    assert_within_tolerance(to_numpy(out), to_numpy(want), "add_rms_norm", "bfloat16", "jit")
    assert_within_tolerance(to_numpy(new_residual), to_numpy(want_residual), "new_residual", "bfloat16", "jit")
    np.testing.assert_array_equal(np.asarray(residual), residual0)  # the alias never clobbers a live input


@pytest.mark.parametrize(("dtype", "with_residual"), [("float32", True), ("bfloat16", False)])
def test_eager_gradients_match_reference(dtype: str, with_residual: bool) -> None:
    """jax.grad outside jit: the custom_vjp picks interpret mode from the arrays' device and runs the backward
    kernels through their own jitted launchers (the shared tests in test_backward_kernels.py run under jit)."""
    shape = (3, 123)
    inputs = {
        "x": sample_inputs(shape, 0, "x"),
        "residual": sample_inputs(shape, 1, "residual") if with_residual else None,
        "weight": sample_inputs(shape[-1:], 2, "weight"),
    }
    x, residual, weight = (_j(a, dtype) if a is not None else None for a in inputs.values())
    ramp = jnp.linspace(-1.0, 1.0, 123)

    def loss(fn, x, residual, weight):
        outs = fn(x, residual, weight, EPS)
        outs = outs if isinstance(outs, tuple) else (outs,)
        # Use every output, with different cotangents, so both outputs' gradients are checked.
        return sum(jnp.sum(o.astype(jnp.float32) * (k + 1) * ramp) for k, o in enumerate(outs))

    got = jax.grad(functools.partial(loss, add_rms_norm), argnums=(0, 1, 2))(x, residual, weight)
    want = jax.jit(jax.grad(functools.partial(loss, add_rms_norm_reference), argnums=(0, 1, 2)))(x, residual, weight)
    d_out = np.broadcast_to(np.linspace(-1.0, 1.0, 123, dtype=np.float32), shape)
    scales = add_rms_norm_term_scales(*inputs.values(), d_out, 2 * d_out if with_residual else None, dtype, EPS)
    for quantity, g, w, scale in zip(("d_x", "d_residual", "d_weight"), got, want, (*scales[:1], *scales), strict=True):
        if with_residual or quantity != "d_residual":
            assert_within_tolerance(to_numpy(g), to_numpy(w), quantity, dtype, "eager", scale)

    x = _j(sample_inputs((3, 246), 0, "gate_up"), dtype)
    got = jax.grad(lambda x: jnp.sum(silu_and_mul(x).astype(jnp.float32) * ramp))(x)
    want = jax.jit(jax.grad(lambda x: jnp.sum(silu_and_mul_reference(x).astype(jnp.float32) * ramp)))(x)
    scale = silu_and_mul_term_scale(sample_inputs((3, 246), 0, "gate_up"), d_out, dtype)
    assert_within_tolerance(to_numpy(got), to_numpy(want), "d_gate_up", dtype, "eager", scale)


@pytest.mark.parametrize(("width", "dtype"), [(123, "bfloat16"), (9728, "float16"), (1, "float32")])
def test_kernels_lower_for_gpu(width: int, dtype: str) -> None:
    """Lower (not run) for CUDA: Pallas' Triton lowering rejects non-power-of-two blocks and unmasked tricks."""
    x, w = jnp.zeros((5, width), dtype), jnp.zeros((width,), dtype)
    fused = jax.jit(lambda x, r, w: add_rms_norm(x, r, w, EPS))  # interpret=None: the platform decides
    text = fused.trace(x, x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in text
    assert "output_operand_aliases" in text  # the new residual may reuse the residual's buffer
    text = jax.jit(silu_and_mul).trace(jnp.zeros((5, 2 * width), dtype)).lower(lowering_platforms=("cuda",))
    assert "__gpu$xla.gpu.triton" in text.as_text()


@pytest.mark.parametrize(("width", "dtype"), [(123, "bfloat16"), (3072, "float32")])
def test_family_kernels_lower_for_gpu(width: int, dtype: str) -> None:
    """Gemma's add_rms_norm (offset, float32 weight) and GeGLU, forward and backward, through the Triton lowering."""
    from kernels.pallas import gelu_tanh_and_mul

    def loss(x, r, w, gate_up):
        out, s = add_rms_norm(x, r, w, EPS, offset=1.0, float32_weight=True)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(s.astype(jnp.float32) * gelu_tanh_and_mul(gate_up))

    x, w, gate_up = jnp.zeros((5, width), dtype), jnp.zeros((width,), dtype), jnp.zeros((5, 2 * width), dtype)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    text = grad.trace(x, x, w, gate_up).lower(lowering_platforms=("cuda",)).as_text()
    for name in ("add_rms_norm", "gelu_tanh_and_mul", "add_rms_norm_backward", "gelu_tanh_and_mul_backward"):
        assert f'name = "{name}"' in text, name
    assert text.count("__gpu$xla.gpu.triton") == 5  # two forward kernels, three backward


# 300 rows of 9728 are 300 one-row blocks: more than 256 programs hold, so each loops over 2 (lax.fori_loop).
@pytest.mark.parametrize(("rows", "width", "dtype"), [(5, 123, "bfloat16"), (300, 9728, "float32")])
def test_backward_kernels_lower_for_gpu(rows: int, width: int, dtype: str) -> None:
    """The backward kernels (and the dW partial sum) lower through Pallas' Triton lowering too."""
    x, w = jnp.zeros((rows, width), dtype), jnp.zeros((width,), dtype)

    def loss(x, r, w, gate_up):
        out, s = add_rms_norm(x, r, w, EPS)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(s.astype(jnp.float32) * silu_and_mul(gate_up))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    text = grad.trace(x, x, w, jnp.zeros((rows, 2 * width), dtype)).lower(lowering_platforms=("cuda",)).as_text()
    for name in ("add_rms_norm_backward", "add_rms_norm_backward_sum_dw", "silu_and_mul_backward"):
        assert f'name = "{name}"' in text, name
    assert text.count("__gpu$xla.gpu.triton") == 5  # two forward kernels, three backward
