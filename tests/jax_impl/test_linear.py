"""jax_impl/linear.py: which products choose between the single dot and the split contraction, that both forms
compute x @ W + b, and that the choice is measured once per shape, outside the trace, and can be pinned.
Nothing here depends on which form is the faster on this machine: each test holds whichever is chosen."""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_impl.linear import (
    CHOICE_MAX_ROWS,
    FORMS,
    PATHS,
    SPLIT_CHUNKS,
    Linear,
    bf16_row_dot_copies,
    dot_general,
    forms_for,
    has_choice,
    path_of,
    product,
    rows_key,
)
from kernels.cpu import jax_gemm, jax_gemv
from parity.tolerances import TOLERANCES

MAX_REL = TOLERANCES["float32"].max_rel  # reordered float32 sums, the table's reviewed bound
BF16_REL = 2.0**-7  # a bfloat16 result rounds to 8 significant bits; the products accumulate in float32
LINEAR_DIMS = (((1,), (0,)), ((), ()))  # nnx.Linear's dimension numbers for a 2-D input
ON_CPU = jax.default_backend() == "cpu"
GEMV = ("gemv",) if ON_CPU and jax_gemv.available() else ()  # the CPU kernel, where it was built
GEMM = ("gemm",) if ON_CPU and jax_gemm.available("float32") else ()  # the many-row kernel, where built (AVX-512)
GEMM_BF16 = ("gemm",) if ON_CPU and jax_gemm.available("bfloat16") else ()  # bfloat16's (AMX or AVX512_BF16)
UPCAST = ("upcast",) if ON_CPU and jax_gemm.upcast_available() else ()  # bfloat16 on gemm.c's float32 loops


def max_rel(got: jax.Array, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def make_linear(in_features: int, out_features: int, bias: bool, seed: int = 0) -> Linear:
    layer = Linear(in_features, out_features, use_bias=bias, dtype=jnp.float32, param_dtype=jnp.float32,
                   precision=jax.lax.Precision.HIGHEST, rngs=nnx.Rngs(seed))  # fmt: skip
    if bias:  # nnx initialises the bias to zeros: make it count
        layer.bias[...] = jax.random.normal(jax.random.key(seed + 1), (out_features,))
    return layer


@pytest.mark.parametrize("path", [None, "dot", "split", "pad", "gemv", "gemm"])  # None: the measured choice
@pytest.mark.parametrize("lead", [(1,), (1, 1, 1), (3,), (2, 5), (3, 77)])  # 10 and 231 rows: more than CHOICE_MAX_ROWS
@pytest.mark.parametrize("in_features", [40, 37])  # 40 = 8 blocks of 5 rows; 37 cannot be split
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_float64_product(path, lead, in_features, bias):
    layer = make_linear(in_features, 53, bias)
    x = jax.random.normal(jax.random.key(2), (*lead, in_features))
    w = np.asarray(layer.kernel[...], np.float64)  # [in, out]
    want = np.asarray(x, np.float64) @ w + (np.asarray(layer.bias[...], np.float64) if bias else 0)
    if path is None:
        got = jax.jit(lambda x: layer(x))(x)
    else:
        with PATHS.forced(path):  # the pin applies while the product is traced
            got = jax.jit(lambda x: layer(x))(x)
    assert got.shape == (*lead, 53) and got.dtype == jnp.float32
    assert max_rel(got, want) <= MAX_REL


@pytest.mark.parametrize("path", ["dot", "split", "pad", "gemv"])
def test_bfloat16_forms_match_float64_product(path):
    gen = np.random.default_rng(6)
    x = jnp.asarray(gen.standard_normal((1, 96)), jnp.bfloat16)
    w = jnp.asarray(gen.standard_normal((96, 40)), jnp.bfloat16)
    got = jax.jit(lambda x, w: dot_general(x, w, LINEAR_DIMS, path=path))(x, w)
    assert got.dtype == jnp.bfloat16
    assert max_rel(got, np.asarray(x, np.float64) @ np.asarray(w, np.float64)) <= BF16_REL


def test_which_products_have_a_choice():
    x, w = jnp.ones((CHOICE_MAX_ROWS, 64)), jnp.ones((64, 24))
    transposed = (((1,), (1,)), ((), ()))  # x @ W^T, W [out, in]: a tied head's product
    cpu = ("dot", "split", *GEMV) if ON_CPU else ("dot",)
    assert forms_for(x, w, LINEAR_DIMS) == cpu
    assert forms_for(x[:1], w, LINEAR_DIMS) == cpu  # float32: no pad
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    assert forms_for(xb[:1], wb, LINEAR_DIMS) == (("dot", "pad", *GEMV) if ON_CPU else ("dot",))  # bf16: no split
    assert forms_for(xb[:1], wb.T, transposed) == (("dot", "pad", *GEMV) if ON_CPU else ("dot",))
    assert forms_for(x, w.T, transposed) == ("dot", *GEMV)  # no split of W^T's columns, no padding of 8 rows
    assert forms_for(xb, wb, LINEAR_DIMS) == ("dot", *GEMV)  # bfloat16, 8 rows: neither split nor pad
    many = jnp.ones((CHOICE_MAX_ROWS + 1, 64))  # prefill-sized: the single dot, or the many-row kernel in float32
    assert forms_for(many, w, LINEAR_DIMS) == ("dot", *GEMM)
    assert forms_for(many.astype(jnp.bfloat16), wb, LINEAR_DIMS) == ("dot", *GEMM_BF16, *UPCAST)
    assert not has_choice(many, w.T, transposed)  # the many-row kernel takes W [in, out] only
    assert forms_for(x[:, :60], w[:60], LINEAR_DIMS) == ("dot", *GEMV)  # 60 rows of W: no 8 equal blocks
    assert forms_for(xb[:1, :60], wb[:60], LINEAR_DIMS) == (("dot", "pad", *GEMV) if ON_CPU else ("dot",))
    assert not has_choice(x.astype(jnp.float16), w.astype(jnp.float16), LINEAR_DIMS)
    assert not has_choice(x[:1], w, (((1,), (0,)), ((0,), (1,))))  # batch dimensions: not a Linear's product


@pytest.mark.skipif(not GEMV, reason="the CPU kernel is not built here")
def test_gemv_form_is_a_custom_call():
    """Pinned, the kernel is what the compiled program calls (an XLA custom call), and its backward is plain dots."""
    w, x = jnp.ones((64, 24)), jnp.ones((1, 64))
    text = jax.jit(lambda x: dot_general(x, w, LINEAR_DIMS, path="gemv")).lower(x).as_text()
    assert "decoder_parity_GemvColsF32" in text
    grad_text = jax.jit(jax.grad(lambda w: dot_general(x, w, LINEAR_DIMS, path="gemv").sum())).lower(w).as_text()
    assert "dot_general" in grad_text  # dW = x^T g: the custom call has no backward of its own


GEMM_CASES = [
    ("gemm", jnp.float32, GEMM, "decoder_parity_GemmF32", MAX_REL),
    ("gemm", jnp.bfloat16, GEMM_BF16, f"decoder_parity_{(jax_gemm.library('bfloat16') or ('', 'none'))[1]}", BF16_REL),
    ("upcast", jnp.bfloat16, UPCAST, "decoder_parity_GemmBF16F32", BF16_REL),
]


@pytest.mark.parametrize(("path", "dtype", "kernel", "target", "tol"), GEMM_CASES)
def test_gemm_form_is_a_custom_call(path, dtype, kernel, target, tol):
    """Pinned, the many-row kernel is what the compiled program calls (where it was built: else the single dot) and
    computes the product; its backward is plain dots that match the float64 gradients (bfloat16's, the single dot's)."""
    gen = np.random.default_rng(3)
    w = jnp.asarray(gen.standard_normal((67, 45)), dtype)
    x = jnp.asarray(gen.standard_normal((2, 13, 67)), dtype)  # [B, T, in]: 26 rows
    dims = (((2,), (0,)), ((), ()))
    pinned = jax.jit(lambda x: dot_general(x, w, dims, precision=jax.lax.Precision.HIGHEST, path=path))
    assert (target in pinned.lower(x).as_text()) == bool(kernel)
    got = pinned(x)
    assert got.dtype == dtype and max_rel(got, np.asarray(x, np.float64) @ np.asarray(w, np.float64)) <= tol

    def loss(x, w, form=path):
        return (dot_general(x, w, dims, precision=jax.lax.Precision.HIGHEST, path=form) ** 2).sum()

    dx, dw = jax.grad(loss, argnums=(0, 1))(x, w)
    if dtype != jnp.float32:  # against the single dot's gradients, the same plain products in bfloat16
        want = jax.grad(functools.partial(loss, form="dot"), argnums=(0, 1))(x, w)
        assert all(max_rel(g, np.asarray(h, np.float64)) <= tol for g, h in zip((dx, dw), want, strict=True))
        return
    x64, w64 = np.asarray(x, np.float64).reshape(26, 67), np.asarray(w, np.float64)
    g = 2 * x64 @ w64  # d(sum y^2)/dy, [26, out]
    assert max_rel(dx.reshape(26, 67), g @ w64.T) <= MAX_REL
    assert max_rel(dw, x64.T @ g) <= MAX_REL


def test_forced_forms_are_what_runs(fresh_choices):
    """The split form's partial sums appear in the program when pinned, and only where the choice applies."""

    def program(rows: int, path: str, dtype=jnp.float32) -> str:
        w, x = jnp.ones((64, 24), dtype), jnp.ones((rows, 64), dtype)
        return str(jax.make_jaxpr(lambda x: dot_general(x, w, LINEAR_DIMS, path=path))(x))

    if ON_CPU:
        assert "reduce_sum" in program(1, "split") and f"{SPLIT_CHUNKS},8,24" in program(1, "split").replace(" ", "")
        padded = program(1, "pad", jnp.bfloat16)
        assert "concatenate" in padded and "2,24" in padded.replace(" ", "")
    assert "reduce_sum" not in program(1, "dot") and "concatenate" not in program(1, "dot", jnp.bfloat16)
    assert "concatenate" not in program(1, "pad")  # float32: no pad form, the single dot
    assert "concatenate" not in program(2, "pad", jnp.bfloat16)  # two rows: nothing to pad
    assert "reduce_sum" not in program(CHOICE_MAX_ROWS + 1, "split")  # no split form there: the single dot
    assert "decoder_parity_Gemm" not in program(CHOICE_MAX_ROWS, "gemm")  # few rows: no many-row kernel
    assert fresh_choices.chosen() == {}  # pinned: nothing measured
    with pytest.raises(ValueError, match="unknown path"):
        program(1, "fast")


@pytest.mark.skipif(not ON_CPU, reason="the choice is made on the CPU only")
@pytest.mark.parametrize(("dtype", "tol"), [(jnp.float32, MAX_REL), (jnp.bfloat16, BF16_REL)])
def test_choice_is_measured_once_per_shape_outside_the_trace(fresh_choices, dtype, tol):
    gen = np.random.default_rng(3)
    x = jnp.asarray(gen.standard_normal((1, 1, 512)), dtype)
    w = jnp.asarray(gen.standard_normal((512, 320)) / 512**0.5, dtype)  # 320 KiB in bfloat16: over MIN_CHOICE_BYTES
    dims = (((2,), (0,)), ((), ()))
    assert path_of(x[..., :64], w[:64, :24], dims) == "dot"  # 3-6 KiB: stays in cache, not measured
    assert fresh_choices.chosen() == {}
    got = jax.jit(lambda x, w: dot_general(x, w, dims, precision=jax.lax.Precision.HIGHEST))(x, w)
    assert max_rel(got, np.asarray(x, np.float64) @ np.asarray(w, np.float64)) <= tol
    (key,) = fresh_choices.chosen()
    assert key == (1, 512, 320, jnp.dtype(dtype).name, "x@W")
    choice = fresh_choices.chosen()[key]
    forms = forms_for(x, w, dims)
    if dtype == jnp.bfloat16 and bf16_row_dot_copies():  # the single dot ruled out: not timed
        assert forms == ("dot", "pad", *GEMV)
        if GEMV:  # the padded form against the kernel
            assert choice.path in GEMV + ("pad",) and set(choice.seconds) == {"pad", *GEMV} and choice.cost > 0
        else:  # the padded form alone: settled untimed
            assert (choice.path, dict(choice.seconds), choice.cost) == ("pad", {}, 0.0)
    else:
        assert choice.path in forms and set(choice.seconds) == set(forms) and choice.cost > 0
    assert choice.rule in ("every", "")  # a decode step's product: measured by its rule, or settled
    assert path_of(x, w, dims) == choice.path  # eager, or traced again: the same form, not measured again
    jax.jit(lambda x, w: dot_general(x, w, dims) * 2)(x, w)
    assert fresh_choices.chosen() == {key: choice}


def test_many_row_keys_are_kept_per_power_of_two():
    assert [rows_key(r) for r in (1, 7, CHOICE_MAX_ROWS)] == [1, 7, CHOICE_MAX_ROWS]  # streamed: exact
    assert [rows_key(r) for r in (CHOICE_MAX_ROWS + 1, 16, 17, 128, 129, 4096)] == [16, 16, 32, 128, 256, 4096]


@pytest.mark.skipif(not GEMM, reason="the many-row CPU kernel is not built here (it needs AVX-512)")
def test_a_prompts_choice_is_measured_once_per_bucket(fresh_choices):
    """A prompt-sized float32 product times the single dot against the many-row kernel once per power-of-two bucket
    of rows: a prompt of 100 tokens and one of 120 share the choice, and each result is the product's."""
    gen = np.random.default_rng(4)
    w = jnp.asarray(gen.standard_normal((512, 160)) / 512**0.5, jnp.float32)  # 320 KiB: over MIN_CHOICE_BYTES
    dims = (((2,), (0,)), ((), ()))
    for tokens in (100, 120):
        x = jnp.asarray(gen.standard_normal((1, tokens, 512)), jnp.float32)
        got = jax.jit(lambda x, w: dot_general(x, w, dims, precision=jax.lax.Precision.HIGHEST))(x, w)
        assert max_rel(got, np.asarray(x, np.float64) @ np.asarray(w, np.float64)) <= MAX_REL
    ((key, choice),) = fresh_choices.chosen().items()
    assert key == (128, 512, 160, "float32", "x@W")
    assert choice.path in ("dot", "gemm") and set(choice.seconds) == {"dot", "gemm"} and choice.cost > 0
    assert choice.rule == "median"  # a prompt's product: spec/choice_rules.py's COMPUTE_BOUND


@pytest.mark.parametrize("path", [None, "dot", "pad", "gemv"])
@pytest.mark.parametrize(("dtype", "tol"), [(jnp.float32, MAX_REL), (jnp.bfloat16, BF16_REL)])
def test_tied_head_product_matches_float64(path, dtype, tol):
    gen = np.random.default_rng(7)
    x = jnp.asarray(gen.standard_normal((1, 1, 96)), dtype)
    table = jnp.asarray(gen.standard_normal((263, 96)), dtype)  # [V, H], a vocabulary not a power of two
    with PATHS.forced(path) if path else contextlib.nullcontext():
        got = jax.jit(lambda x, e: product(x, e, precision=jax.lax.Precision.HIGHEST))(x, table)
    assert got.shape == (1, 1, 263) and got.dtype == dtype
    assert max_rel(got, np.asarray(x, np.float64) @ np.asarray(table, np.float64).T) <= tol


@pytest.mark.skipif(not ON_CPU, reason="the choice is made on the CPU only")
def test_tied_head_takes_the_products_choice():
    """Embedding.attend (a tied model's logits) goes through `product`: a pinned form is what its program runs. As a
    plain einsum, XLA:CPU converted a bfloat16 table to a float32 copy on every decode step (the whole table, 622 MB
    at the 0.6B shape) before its matrix-vector product."""
    from jax_impl.embedding import Embedding

    table = Embedding(263, 96, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    x = jnp.ones((1, 1, 96), jnp.bfloat16)
    with PATHS.forced("pad"):
        padded = str(jax.make_jaxpr(table.attend)(x))
    with PATHS.forced("dot"):
        single = str(jax.make_jaxpr(table.attend)(x))
    assert "concatenate" in padded and "concatenate" not in single


@pytest.mark.skipif(not ON_CPU, reason="XLA:CPU's lowering")
def test_the_bf16_row_rule_reads_the_lowering_it_rests_on():
    """`bf16_row_dot_copies` (read on a small shape) says what the compiled programs of a decode-sized product
    show: the single dot of one bf16 row through a float32 copy of the weight, the padded form without one. Either
    answer is allowed (the lowering may differ between processors and jaxlibs); it must be the true one."""
    hi = jax.lax.Precision.HIGHEST
    args = jax.ShapeDtypeStruct((1, 1024), jnp.bfloat16), jax.ShapeDtypeStruct((1024, 2048), jnp.bfloat16)

    def copies(form: str) -> bool:
        text = jax.jit(lambda x, w: FORMS[form](x, w, 0, hi, None)).lower(*args).compile().as_text()
        return "f32[1024,2048]" in text

    assert bf16_row_dot_copies() == (copies("dot") and not copies("pad"))


@pytest.mark.skipif(not ON_CPU, reason="XLA:CPU's lowering")
def test_the_bf16_row_probe_is_charged_to_the_choice_cost(fresh_choices):
    """Reading the lowering compiles two programs, once per process: part of what choosing costs (the benchmark
    reports PATHS.cost()), though it belongs to no one key's measurement."""
    bf16_row_dot_copies.cache_clear()
    assert fresh_choices.cost() == 0.0
    bf16_row_dot_copies()
    charged = fresh_choices.cost()
    assert charged > 0.0 and fresh_choices.chosen() == {}
    bf16_row_dot_copies()  # read once: no second charge
    assert fresh_choices.cost() == charged


def test_every_form_agrees():
    gen = np.random.default_rng(3)
    x = jnp.asarray(gen.standard_normal((1, 1, 3072)), jnp.float32)  # down_proj's width, a decode step
    w = jnp.asarray(gen.standard_normal((3072, 101)) / 3072**0.5, jnp.float32)
    hi, dims = jax.lax.Precision.HIGHEST, (((2,), (0,)), ((), ()))
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    for path in PATHS.paths:
        assert max_rel(dot_general(x, w, dims, precision=hi, path=path), want) <= MAX_REL


@pytest.mark.parametrize(("path", "dtype", "tol"), [("dot", jnp.float32, MAX_REL), ("split", jnp.float32, MAX_REL),
                                                     ("pad", jnp.bfloat16, 4 * BF16_REL),
                                                     ("gemv", jnp.float32, MAX_REL),
                                                     ("gemv", jnp.bfloat16, 4 * BF16_REL)])  # fmt: skip
def test_gradients_match_the_single_dot(path, dtype, tol):
    layer = make_linear(48, 29, bias=True)
    x = jax.random.normal(jax.random.key(4), (1, 1, 48)).astype(dtype)
    w, b = layer.kernel[...].astype(dtype), layer.bias[...].astype(dtype)
    dims, hi = (((2,), (0,)), ((), ())), jax.lax.Precision.HIGHEST

    def loss(x, w, dot):
        return jnp.sum(jnp.square(dot(x, w, dims, precision=hi).astype(jnp.float32) + b))

    got = jax.grad(loss, argnums=(0, 1))(x, w, lambda *a, **k: dot_general(*a, **k, path=path))
    x32, w32 = x.astype(jnp.float32), w.astype(jnp.float32)  # the reference: float32 throughout
    want = jax.grad(loss, argnums=(0, 1))(x32, w32, jax.lax.dot_general)
    for g, r in zip(got, want, strict=True):
        g = np.asarray(g, np.float32)
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol * float(jnp.abs(r).max()))


def test_parameters_are_nnx_linears():
    """Same names and layout as nnx.Linear, so the loader and the sharding rules see no difference."""
    layer = make_linear(16, 8, bias=True)
    assert layer.kernel[...].shape == (16, 8) and layer.bias[...].shape == (8,)
    assert isinstance(layer, nnx.Linear)
