"""Decoder layers in the plain residual flow: post-norm (OLMo 2) and parallel residual (GPT-NeoX).

Mirrors torch_impl/decoder_layer_plain.py. Neither has a norm in front of an add into the residual stream that
an add_rms_norm could fuse with (OLMo 2 normalizes the increments, GPT-NeoX's two norms read the same x), so the
stream is carried as one variable: a layer takes (x, None) and returns (x_new, None), and Model's loop and its
final `norm(hidden, residual)` (residual None: a plain norm of x) work unchanged. Every add is one float32 add
rounded to the activation dtype, the rounding an unfused transformers model makes.

    post-norm:  x1 = x + post_attention_layernorm(Attn(x));  x2 = x1 + post_feedforward_layernorm(MLP(x1))
    parallel:   x2 = (MLP(post_attention_layernorm(x)) + Attn(input_layernorm(x))) + x    (in that order)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl.attention import Attention
from jax_impl.layernorm import make_norm
from jax_impl.mlp import MLP
from spec import ModelSpec

if TYPE_CHECKING:
    from jax_impl.kv_cache import KVCache


def add(a: jax.Array, b: jax.Array) -> jax.Array:
    """a + b in float32, rounded once to a's dtype: what the fused add_rms_norm stores as its new residual."""
    return (a.astype(jnp.float32) + b.astype(jnp.float32)).astype(a.dtype)


def _plain_input(residual: jax.Array | None) -> None:
    if residual is not None:
        raise AssertionError("a plain-flow layer carries the residual stream whole: residual must be None")


class PostNormDecoderLayer(nnx.Module):
    """OLMo 2: no input norm; each sublayer's output is normalized before it is added to the stream."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        *,
        dtype: jnp.dtype,
        kernels: str = "reference",
        tp: int = 1,
        rngs: nnx.Rngs,
    ):
        self.layer_idx = layer_idx
        norm = dict(dtype=dtype, kernels=kernels)
        self.self_attn = Attention(spec, layer_idx, dtype=dtype, kernels=kernels, rngs=rngs)
        self.post_attention_layernorm = make_norm(spec, spec.hidden_size, **norm)
        self.mlp = MLP(spec, layer_idx, dtype=dtype, kernels=kernels, tp=tp, rngs=rngs)
        self.post_feedforward_layernorm = make_norm(spec, spec.hidden_size, **norm)

    def __call__(
        self,
        hidden: jax.Array,
        residual: jax.Array | None,
        cos: jax.Array,
        sin: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        trace: dict[str, jax.Array] | None = None,
    ) -> tuple[jax.Array, None, KVCache | None]:
        _plain_input(residual)
        name = f"layers.{self.layer_idx}"
        out, cache = self.self_attn(hidden, cos, sin, mask, cache, trace)
        normed = self.post_attention_layernorm(out)
        x1 = add(hidden, normed)
        mlp_out = self.mlp(x1, trace)
        mlp_normed = self.post_feedforward_layernorm(mlp_out)
        x2 = add(x1, mlp_normed)
        if trace is not None:
            trace[f"{name}.attn_out"] = out
            trace[f"{name}.attn_post_norm"] = normed
            trace[f"{name}.x1"] = x1
            trace[f"{name}.mlp_out"] = mlp_out
            trace[f"{name}.mlp_post_norm"] = mlp_normed
            trace[f"{name}.x2"] = x2
        return x2, None, cache


class ParallelDecoderLayer(nnx.Module):
    """GPT-NeoX's parallel residual: attention and MLP both read x, through their own norms."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        *,
        dtype: jnp.dtype,
        kernels: str = "reference",
        tp: int = 1,
        rngs: nnx.Rngs,
    ):
        self.layer_idx = layer_idx
        norm = dict(dtype=dtype, kernels=kernels)
        self.input_layernorm = make_norm(spec, spec.hidden_size, **norm)
        self.self_attn = Attention(spec, layer_idx, dtype=dtype, kernels=kernels, rngs=rngs)
        self.post_attention_layernorm = make_norm(spec, spec.hidden_size, **norm)
        self.mlp = MLP(spec, layer_idx, dtype=dtype, kernels=kernels, tp=tp, rngs=rngs)

    def __call__(
        self,
        hidden: jax.Array,
        residual: jax.Array | None,
        cos: jax.Array,
        sin: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        trace: dict[str, jax.Array] | None = None,
    ) -> tuple[jax.Array, None, KVCache | None]:
        _plain_input(residual)
        name = f"layers.{self.layer_idx}"
        attn_in = self.input_layernorm(hidden)
        attn_out, cache = self.self_attn(attn_in, cos, sin, mask, cache, trace)
        mlp_in = self.post_attention_layernorm(hidden)
        mlp_out = self.mlp(mlp_in, trace)
        x2 = add(add(mlp_out, attn_out), hidden)  # transformers' mlp_output + attn_output + hidden_states
        if trace is not None:
            trace[f"{name}.input_norm"] = attn_in
            trace[f"{name}.attn_out"] = attn_out
            trace[f"{name}.post_attn_norm"] = mlp_in
            trace[f"{name}.mlp_out"] = mlp_out
            trace[f"{name}.x2"] = x2
        return x2, None, cache
