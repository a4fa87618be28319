"""jax_impl's model: the behaviour both twins share (tests/twins/model.py), then JAX specifics: a tied model
has no head parameter, one jit entry point, dtype on load."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_impl
import spec
from jax_impl.layernorm import RMSNorm
from tests.backends import to_numpy
from tests.twins.model import ModelTwin


class TestModelTwin(ModelTwin):
    backend = "jax"
    other_framework = ("torch", "triton")

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None = None) -> Any:
        norm = RMSNorm(x.shape[-1], eps, dtype=jnp.float32)
        norm.weight[...] = jnp.asarray(weight)
        out = norm(jnp.asarray(x)) if residual is None else norm(jnp.asarray(x), jnp.asarray(residual))
        return to_numpy(out) if residual is None else tuple(to_numpy(o) for o in out)


def test_tied_model_has_no_head_parameter(default_dir):
    model = jax_impl.from_pretrained(default_dir)
    assert model.lm_head is None
    params = nnx.state(model, nnx.Param)
    paths = [".".join(str(p) for p in path) for path, _ in nnx.to_flat_state(params)]
    assert not any(p.startswith("lm_head") for p in paths)
    assert sum(v.size for v in jax.tree_util.tree_leaves(params)) == spec.parameter_count(model.spec)


def test_forward_compiles_once_per_shape(default_dir):
    model = jax_impl.from_pretrained(default_dir)
    jax_impl.forward.clear_cache()
    model([[1, 2, 3]])
    model([[4, 5, 6]])
    assert jax_impl.forward._cache_size() == 1
    model([[4, 5, 6, 7]])
    assert jax_impl.forward._cache_size() == 2


def test_load_in_bfloat16(default_dir):
    model = jax_impl.from_pretrained(default_dir, dtype="bfloat16")
    assert model([[1, 2, 3]]).dtype == jnp.bfloat16
    assert model.model.layers[0].mlp.gate_up_proj.kernel[...].shape == (64, 352)  # Flax [in, out]


def test_rope_tables_are_cos_and_sin_of_the_doubled_angles(default_dir):
    """The tables (each half written twice by a product, so that XLA computes them once) are, bit for bit, cos and
    sin of [freqs, freqs] in float32, at positions up to 40959; position 0 gives cos 1 and sin 0, and a partial
    rotary spec (GPT-NeoX's: half of each head) gives tables of its rotary width."""
    import dataclasses

    from jax_impl.rotary_embedding import RotaryEmbedding

    full = spec.ModelSpec.from_pretrained(default_dir)
    cases = [(full, 40960), (dataclasses.replace(full, partial_rotary_factor=0.5), 64)]
    for model_spec, count in cases:
        positions = jnp.arange(count).reshape(2, -1)  # [B, T]
        cos, sin = jax.jit(RotaryEmbedding(model_spec))(positions)
        freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(model_spec.inv_freq("full"))
        angles = jnp.concatenate((freqs, freqs), axis=-1)  # [B, T, r]
        want_cos, want_sin = jax.jit(lambda a: (jnp.cos(a), jnp.sin(a)))(angles)
        assert cos.shape == sin.shape == angles.shape and angles.shape[-1] == model_spec.rotary_dim
        np.testing.assert_array_equal(np.asarray(cos), np.asarray(want_cos))
        np.testing.assert_array_equal(np.asarray(sin), np.asarray(want_sin))
        assert float(cos[0, 0, 0]) == 1.0 and float(sin[0, 0, 0]) == 0.0
