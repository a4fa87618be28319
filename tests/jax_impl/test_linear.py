"""jax_impl/linear.py: which products split their contraction, and that both paths compute x @ W + b."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_impl.linear import SPLIT_CHUNKS, SPLIT_MAX_ROWS, Linear, dot_general, splits_contraction
from parity.tolerances import TOLERANCES

MAX_REL = TOLERANCES["float32"].max_rel  # reordered float32 sums, the table's reviewed bound
LINEAR_DIMS = (((1,), (0,)), ((), ()))  # nnx.Linear's dimension numbers for a 2-D input


def max_rel(got: jax.Array, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def make_linear(in_features: int, out_features: int, bias: bool, seed: int = 0) -> Linear:
    layer = Linear(in_features, out_features, use_bias=bias, dtype=jnp.float32, param_dtype=jnp.float32,
                   precision=jax.lax.Precision.HIGHEST, rngs=nnx.Rngs(seed))  # fmt: skip
    if bias:  # nnx initialises the bias to zeros: make it count
        layer.bias[...] = jax.random.normal(jax.random.key(seed + 1), (out_features,))
    return layer


@pytest.mark.parametrize("lead", [(1,), (1, 1, 1), (3,), (2, 5)])  # one row splits; 3 and 10 do not
@pytest.mark.parametrize("in_features", [40, 37])  # 40 = 8 blocks of 5 rows; 37 cannot be split
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_float64_product(lead, in_features, bias):
    layer = make_linear(in_features, 53, bias)
    x = jax.random.normal(jax.random.key(2), (*lead, in_features))
    w = np.asarray(layer.kernel[...], np.float64)  # [in, out]
    want = np.asarray(x, np.float64) @ w + (np.asarray(layer.bias[...], np.float64) if bias else 0)
    got = jax.jit(lambda x: layer(x))(x)
    assert got.shape == (*lead, 53) and got.dtype == jnp.float32
    assert max_rel(got, want) <= MAX_REL


def test_which_products_split():
    x, w = jnp.ones((SPLIT_MAX_ROWS, 64)), jnp.ones((64, 24))
    assert splits_contraction(x, w, LINEAR_DIMS, None) is (jax.default_backend() == "cpu")
    assert not splits_contraction(jnp.ones((SPLIT_MAX_ROWS + 1, 64)), w, LINEAR_DIMS, None)  # prefill-sized
    assert not splits_contraction(x[:, :60], w[:60], LINEAR_DIMS, None)  # 60 rows of W: no 8 equal blocks
    assert not splits_contraction(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), LINEAR_DIMS, None)
    assert not splits_contraction(x, w.T, (((1,), (1,)), ((), ())), None)  # not nnx.Linear's form


def test_split_path_is_what_runs():
    """The split path's partial sums appear in the program, and only for decode-sized inputs."""
    w = jnp.ones((64, 24))

    def program(rows: int) -> str:
        return str(jax.make_jaxpr(lambda x: dot_general(x, w, LINEAR_DIMS))(jnp.ones((rows, 64))))

    if jax.default_backend() == "cpu":
        assert "reduce_sum" in program(1) and f"{SPLIT_CHUNKS},8,24" in program(1).replace(" ", "")
    assert "reduce_sum" not in program(SPLIT_MAX_ROWS + 1)


def test_split_and_single_dot_agree():
    gen = np.random.default_rng(3)
    x = jnp.asarray(gen.standard_normal((1, 1, 3072)), jnp.float32)  # down_proj's width, a decode step
    w = jnp.asarray(gen.standard_normal((3072, 101)) / 3072**0.5, jnp.float32)
    hi = jax.lax.Precision.HIGHEST
    split = dot_general(x, w, (((2,), (0,)), ((), ())), precision=hi)
    single = jax.lax.dot_general(x, w, (((2,), (0,)), ((), ())), precision=hi)
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    assert max_rel(split, want) <= MAX_REL and max_rel(single, want) <= MAX_REL


def test_gradients_match_the_single_dot():
    layer = make_linear(48, 29, bias=True)
    x = jax.random.normal(jax.random.key(4), (1, 1, 48))
    w, b = layer.kernel[...], layer.bias[...]

    def loss(x, w, dot):
        return jnp.sum(jnp.square(dot(x, w, (((2,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST) + b))

    got = jax.grad(loss, argnums=(0, 1))(x, w, dot_general)
    want = jax.grad(loss, argnums=(0, 1))(x, w, jax.lax.dot_general)
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=MAX_REL, atol=MAX_REL * float(jnp.abs(r).max()))


def test_parameters_are_nnx_linears():
    """Same names and layout as nnx.Linear, so the loader and the sharding rules see no difference."""
    layer = make_linear(16, 8, bias=True)
    assert layer.kernel[...].shape == (16, 8) and layer.bias[...].shape == (8,)
    assert isinstance(layer, nnx.Linear)
