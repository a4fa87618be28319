"""Grouped-query causal self-attention with RoPE and the families' q/k norms, soft-capping and fused qkv.

Mirrors torch_impl/attention.py. q/k/v projections (bias where the spec says so), or GPT-NeoX's one qkv
projection laid out per head ([n, 3, d]); q/k norms before RoPE, per head over d (Qwen3, Gemma 3) or over the
whole projection before the view into heads (OLMo 2); rotate-half RoPE, partial where the spec says so; key/value
heads shared by `num_kv_groups` consecutive query heads (query head h reads kv head h // groups, as
repeat_interleave of the keys would give, done as a reshape of the queries); scores (scaled by
spec.attention_scale, soft-capped in Gemma 2) and softmax in float32; output projection (bias in GPT-NeoX). The
layer's sliding window arrives in its mask (jax_impl/model.py builds one per layer kind). An optional KV cache
receives this step's keys and values and returns the slots to attend over (functionally): every one, or on
a sliding layer its ring of the window's slots and this step's (kv_cache.py; the mask follows their slots).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl.layernorm import make_norm
from jax_impl.linear import Linear
from jax_impl.rotary_embedding import apply_rotary
from kernels.cpu import jax_decode_ops
from spec import ModelSpec

if TYPE_CHECKING:
    from jax_impl.kv_cache import KVCache

HIGHEST = jax.lax.Precision.HIGHEST


def group_heads(q: jax.Array, num_kv_heads: int) -> jax.Array:
    """[B, T, n, d] -> [B, T, n_kv, groups, d]: query head h = kv * groups + g reads kv head h // groups.

    The same mapping as repeat_interleave of the keys (Hugging Face's repeat_kv), without copying them
    (on CPU, copying the cached keys per layer made a decode step a third slower).
    """
    b, t, n, d = q.shape
    return q.reshape(b, t, num_kv_heads, n // num_kv_heads, d)


def attend(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float, softcap: float | None = None
) -> jax.Array:
    """q [B, T, n_kv, g, d] (grouped), k [B, n_kv, S, d], v [B, n_kv, d, S], mask [B, T, S] bool (True = may
    attend): the KV cache's layouts (kv_cache.py says why).

    Returns [B, T, n_kv, g, d]. Scores, softmax and the weighted sum run in float32; masked scores get the
    float32 minimum rather than -inf so that a fully masked (padding) row stays finite instead of NaN. A
    `softcap` (Gemma 2) maps the scaled scores to cap * tanh(scores / cap) before the mask, as transformers does.
    A kv head's g query heads are one block of g * T rows, so each product is one matrix product per kv head (the
    same dot products as g * T separate ones, in less time).
    """
    f32 = jnp.float32
    b, t, n_kv, g, d = q.shape
    rows = q.transpose(0, 2, 3, 1, 4).reshape(b, n_kv, g * t, d)  # [B, n_kv, g*T, d]
    if q.dtype == k.dtype and jnp.finfo(q.dtype).nmant <= 10:
        # bf16 / f16: each product is exact in float32, so the dot of q and k as they are, summed in float32, is the
        # float32 dot of their widened values, and XLA:CPU runs it without widening first (half the time in a prefill)
        scores = jnp.einsum("bkmd,bksd->bkms", rows, k, precision=HIGHEST, preferred_element_type=f32)
    else:
        scores = jnp.einsum("bkmd,bksd->bkms", rows.astype(f32), k.astype(f32), precision=HIGHEST)
    scores = scores.reshape(b, n_kv, g, t, -1) * scale  # [B, n_kv, g, T, S]
    if softcap is not None:
        scores = softcap * jnp.tanh(scores / softcap)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(f32).min)  # [B, n_kv, g, T, S]
    probs = jax.nn.softmax(scores, axis=-1).reshape(b, n_kv, g * t, -1)  # [B, n_kv, g*T, S]
    out = jnp.einsum("bkms,bkds->bkmd", probs, v.astype(f32), precision=HIGHEST)  # [B, n_kv, g*T, d]
    return out.reshape(b, n_kv, g, t, d).transpose(0, 3, 1, 2, 4).astype(q.dtype)  # [B, T, n_kv, g, d]


class Attention(nnx.Module):
    def __init__(
        self, spec: ModelSpec, layer_idx: int, *, dtype: jnp.dtype, kernels: str = "reference", rngs: nnx.Rngs
    ):
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            spec.num_attention_heads,
            spec.num_key_value_heads,
            spec.head_dim,
        )
        self.scale = spec.attention_scale  # head_dim ** -0.5, or query_pre_attn_scalar ** -0.5 (Gemma)
        self.softcap = spec.attn_logit_softcapping
        self.fused_qkv = spec.fused_qkv
        self.qk_norm_scope = spec.qk_norm_scope
        h, q_out, kv_out = spec.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        kw = dict(dtype=dtype, param_dtype=dtype, precision=HIGHEST, rngs=rngs)
        if self.fused_qkv and spec.qk_norm and spec.qk_norm_scope == "projection":
            raise NotImplementedError("fused_qkv with a q/k norm over the whole projection is not implemented")
        if self.fused_qkv:  # outputs per head [n, 3, d]: a head's q, k, v side by side (GPT-NeoX)
            self.qkv_proj = Linear(h, q_out + 2 * kv_out, use_bias=spec.attention_bias, **kw)
        else:
            self.q_proj = Linear(h, q_out, use_bias=spec.attention_bias, **kw)
            self.k_proj = Linear(h, kv_out, use_bias=spec.attention_bias, **kw)
            self.v_proj = Linear(h, kv_out, use_bias=spec.attention_bias, **kw)
        self.o_proj = Linear(q_out, h, use_bias=spec.o_proj_bias, **kw)
        if spec.qk_norm:  # over each head's d, or over the whole projection (OLMo 2)
            per_head = spec.qk_norm_scope == "head"
            norm = dict(dtype=dtype, kernels=kernels)
            self.q_norm = make_norm(spec, self.head_dim if per_head else q_out, **norm)
            self.k_norm = make_norm(spec, self.head_dim if per_head else kv_out, **norm)
        else:
            self.q_norm = self.k_norm = None

    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        trace: dict[str, jax.Array] | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        b, t, _ = x.shape
        n, n_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.fused_qkv:
            qkv = self.qkv_proj(x).reshape(b, t, n, 3 * d)  # [B, T, n, 3d]: per head, q then k then v
            q, k, v = jnp.split(qkv, 3, axis=-1)  # [B, T, n, d] each (fused_qkv: n_kv == n)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # [B, T, n*d], [B, T, n_kv*d] x2
            if self.q_norm is not None and self.qk_norm_scope == "projection":  # OLMo 2: before the view
                q, k = self.q_norm(q), self.k_norm(k)
            q = q.reshape(b, t, n, d)  # [B, T, n, d]
            k, v = k.reshape(b, t, n_kv, d), v.reshape(b, t, n_kv, d)  # [B, T, n_kv, d]
        if self.q_norm is not None and self.qk_norm_scope == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if trace is not None:
            trace[f"layers.{self.layer_idx}.attn.q"] = q
            trace[f"layers.{self.layer_idx}.attn.k"] = k
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 3, 1)  # [B, n_kv, T, d], [B, n_kv, d, T]
        q = group_heads(q, n_kv)  # [B, T, n_kv, g, d]
        kernel = cache is not None and not cache.ring[self.layer_idx] and jax_decode_ops.takes(q, k, v)
        if kernel and t == 1 and jax_decode_ops.decoding():
            # A decode step on the CPU: the kernel reads the written slots [0, end) of the buffers in place. Not a
            # one-token prompt: its prefill's mask spans the prompt alone, not the buffer's S slots.
            end = cache.length + t
            cache, k, v = cache.update(self.layer_idx, k, v, zeroed=False)  # [B, n_kv, S, d], [B, n_kv, d, S]
            out = jax_decode_ops.attend(q, k, v, mask, self.scale, self.softcap, keys=end)  # [B, T, n_kv, g, d]
        else:
            if cache is not None:  # [B, n_kv, S, d], [B, n_kv, d, S]: every slot (or the ring) and the new ones
                cache, k, v = cache.update(self.layer_idx, k, v)
                s = mask.shape[-1]  # fewer than S: a prefill from an empty cache, the later slots unwritten
                k, v = k[:, :, :s], v[..., :s]  # [B, n_kv, s, d], [B, n_kv, d, s]
            # a prompt on the CPU (generation's): the kernel's blocked products, the same math
            out = (jax_decode_ops.attend if kernel else attend)(q, k, v, mask, self.scale, self.softcap)
        return self.o_proj(out.reshape(b, t, n * d)), cache  # [B, T, H]
