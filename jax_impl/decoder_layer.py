"""One pre-norm decoder layer in the dual-variable residual flow (docs/design.md, "The dual-variable flow"), and
`decoder_layer`, which picks the layer class a spec's structure needs.

Mirrors torch_impl/decoder_layer.py. A layer takes and returns (hidden, residual): the add of the
previous increment into the residual stream happens inside the next add_rms_norm, so the returned
hidden is the MLP's increment, not x2. Trace mode records the math variables x1 and x2 explicitly.

The sandwich layer (Gemma 2 / 3) is the same flow with a plain norm on each increment: post_attention_layernorm
on the attention output (HF's name: in a sandwich layer it is the norm ON the attention output), then
pre_feedforward_layernorm fuses the add into x1 with the MLP's input norm, and post_feedforward_layernorm normalizes
the MLP's output before the next add. The post-norm (OLMo 2) and parallel-residual (GPT-NeoX) layers are plain-flow
layers in jax_impl/decoder_layer_plain.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl import layer_choice
from jax_impl.attention import Attention
from jax_impl.decoder_layer_plain import ParallelDecoderLayer, PostNormDecoderLayer, add
from jax_impl.layernorm import make_norm
from jax_impl.mlp import MLP
from jax_impl.moe import SparseMoeBlock
from kernels.cpu import decode_layer_operands, jax_decode_layer
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
        ep: int = 1,
        rngs: nnx.Rngs,
    ):
        self.layer_idx = layer_idx
        self.sandwich = spec.norm_placement == "sandwich"
        norm = dict(dtype=dtype, kernels=kernels)
        self.input_layernorm = make_norm(spec, spec.hidden_size, **norm)
        self.self_attn = Attention(spec, layer_idx, dtype=dtype, kernels=kernels, rngs=rngs)
        self.post_attention_layernorm = make_norm(spec, spec.hidden_size, **norm)
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(spec, spec.hidden_size, **norm)
            self.post_feedforward_layernorm = make_norm(spec, spec.hidden_size, **norm)
        self.sparse = spec.is_sparse(layer_idx)  # routes its tokens to experts (jax_impl/moe.py)
        if self.sparse:
            self.mlp = SparseMoeBlock(spec, layer_idx, dtype=dtype, kernels=kernels, tp=tp, ep=ep, rngs=rngs)
        else:
            self.mlp = MLP(spec, layer_idx, dtype=dtype, kernels=kernels, tp=tp, rngs=rngs)
        # the layers decode_layer.c computes; the rest of the rule is asked per step
        self.one_call = decode_layer_operands.computes(spec, layer_idx) and kernels == "reference" and tp == 1

    def __call__(
        self,
        hidden: jax.Array,
        residual: jax.Array | None,
        cos: jax.Array,
        sin: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        trace: dict[str, jax.Array] | None = None,
        routing: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array, KVCache | None]:
        """`routing` [B, T, k]: a sparse layer's teacher-forced expert ids (jax_impl/moe.py)."""
        if self.one_call and cache is not None and trace is None and self._takes_one_call(hidden, cache):
            return self._decode_in_one_call(hidden, residual, cos, sin, mask, cache)
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
        if self.sandwich:  # the attention increment is normalized before it joins the stream
            hidden = self.post_attention_layernorm(hidden)
            if trace is not None:
                trace[f"{name}.attn_post_norm"] = hidden
            hidden, residual = self.pre_feedforward_layernorm(hidden, residual)  # residual is now x1
        else:
            hidden, residual = self.post_attention_layernorm(hidden, residual)  # residual is now x1
        if trace is not None:
            trace[f"{name}.x1"] = residual
            trace[f"{name}.post_attn_norm"] = hidden
        # an increment: x2 = hidden + residual, materialized later
        hidden = self.mlp(hidden, trace, routing) if self.sparse else self.mlp(hidden, trace)
        if trace is not None:
            trace[f"{name}.mlp_out"] = hidden
        if self.sandwich:
            hidden = self.post_feedforward_layernorm(hidden)
            if trace is not None:
                trace[f"{name}.mlp_post_norm"] = hidden
        if trace is not None:
            trace[f"{name}.x2"] = add(hidden, residual)
        return hidden, residual, cache

    def _takes_one_call(self, hidden: jax.Array, cache: KVCache) -> bool:
        """Whether this step runs in one call: a decode step's rows (jax_decode_layer.takes), and the layer's rule or
        pin (jax_impl/layer_choice.py; asked while tracing: the compiled step keeps the answer)."""
        if not jax_decode_layer.takes(hidden, cache.k[self.layer_idx]):
            return False
        return layer_choice.takes_one_call(self, hidden)

    def _decode_in_one_call(
        self, hidden: jax.Array, residual: jax.Array | None, cos, sin, mask, cache: KVCache
    ) -> tuple[jax.Array, jax.Array, KVCache]:
        """This layer's decode step as jax_decode_layer.decode_layer: the new keys and values written in place at the
        cache's next slot, the slot recorded as cache.update records it."""
        attn, mlp, norm = self.self_attn, self.mlp, self.input_layernorm

        def value(param: nnx.Param | None) -> jax.Array | None:
            return None if param is None else param[...]

        weights = jax_decode_layer.LayerWeights(
            norm.weight[...], self.post_attention_layernorm.weight[...],
            None if attn.q_norm is None else attn.q_norm.weight[...],
            None if attn.k_norm is None else attn.k_norm.weight[...],
            *(p.kernel[...] for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_up_proj)),
            mlp.down_proj.kernel[...],
            *(value(p.bias) for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_up_proj)),
            value(mlp.down_proj.bias),
        )  # fmt: skip
        i = self.layer_idx
        hidden, residual, k, v = jax_decode_layer.decode_layer(
            hidden, residual, weights, cos, sin, cache.k[i], cache.v[i], cache.length, mask,
            heads=attn.num_heads, eps=norm.eps, scale=attn.scale, softcap=attn.softcap, offset=norm.offset,
            float32_weight=norm.float32_weight,
        )  # fmt: skip
        return hidden, residual, cache.written(i, k, v, 1)


def decoder_layer(
    spec: ModelSpec, layer_idx: int, *, dtype: jnp.dtype, kernels: str = "reference", tp: int = 1, ep: int = 1,
    rngs: nnx.Rngs,
) -> DecoderLayer | PostNormDecoderLayer | ParallelDecoderLayer:  # fmt: skip
    """The layer class the spec's residual structure needs: pre-norm or sandwich (dual-variable flow), post-norm
    (OLMo 2) or parallel residual (GPT-NeoX), the last two in the plain flow."""
    kw = dict(dtype=dtype, kernels=kernels, tp=tp, rngs=rngs)
    if spec.norm_placement == "post":  # the same order as torch_impl's picker (the spec refuses both at once)
        return PostNormDecoderLayer(spec, layer_idx, **kw)
    if spec.parallel_residual:
        return ParallelDecoderLayer(spec, layer_idx, **kw)
    return DecoderLayer(spec, layer_idx, ep=ep, **kw)  # the spec allows experts in the pre-norm layer only
