"""One pre-norm decoder layer in the dual-variable residual flow (docs/design.md, "The dual-variable flow").

Mirrors torch_impl/decoder_layer.py. A layer takes and returns (hidden, residual): the add of the
previous increment into the residual stream happens inside the next add_rms_norm, so the returned
hidden is the MLP's increment, not x2. Trace mode records the math variables x1 and x2 explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl.attention import Attention
from jax_impl.layernorm import RMSNorm
from jax_impl.mlp import MLP
from spec import ModelSpec

if TYPE_CHECKING:
    from jax_impl.kv_cache import KVCache


class DecoderLayer(nnx.Module):
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
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype=dtype, kernels=kernels)
        self.self_attn = Attention(spec, layer_idx, dtype=dtype, kernels=kernels, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype=dtype, kernels=kernels)
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
    ) -> tuple[jax.Array, jax.Array, KVCache | None]:
        if residual is None:  # layer 0: the residual stream starts as the embedding h0
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:  # residual := previous increment + residual (= the previous layer's x2)
            hidden, residual = self.input_layernorm(hidden, residual)
        name = f"layers.{self.layer_idx}"
        if trace is not None:
            trace[f"{name}.input_norm"] = hidden
        hidden, cache = self.self_attn(hidden, cos, sin, mask, cache, trace)
        if trace is not None:
            trace[f"{name}.attn_out"] = hidden
        hidden, residual = self.post_attention_layernorm(hidden, residual)  # residual is now x1
        if trace is not None:
            trace[f"{name}.x1"] = residual
            trace[f"{name}.post_attn_norm"] = hidden
        hidden = self.mlp(hidden, trace)  # an increment: x2 = hidden + residual, materialized later
        if trace is not None:
            trace[f"{name}.mlp_out"] = hidden
            trace[f"{name}.x2"] = (hidden.astype(jnp.float32) + residual.astype(jnp.float32)).astype(hidden.dtype)
        return hidden, residual, cache
