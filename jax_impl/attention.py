"""Grouped-query causal self-attention with RoPE and Qwen3's per-head q/k RMSNorm.

Mirrors torch_impl/attention.py. q/k/v projections (bias where the spec says so), per-head RMSNorm on q and
k before RoPE (Qwen3), rotate-half RoPE, key/value heads shared by `num_kv_groups` consecutive query
heads (query head h reads kv head h // groups, as repeat_interleave of the keys would give, done as a reshape
of the queries), scores and softmax in float32, output projection. An optional
KV cache receives this step's keys and values and returns every cached slot (functionally).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl.layernorm import RMSNorm
from jax_impl.linear import Linear
from jax_impl.rotary_embedding import apply_rotary
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


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """q [B, T, n_kv, g, d] (grouped), k [B, n_kv, S, d], v [B, n_kv, d, S], mask [B, T, S] bool (True = may
    attend): the KV cache's layouts (kv_cache.py says why).

    Returns [B, T, n_kv, g, d]. Scores, softmax and the weighted sum run in float32; masked scores get the
    float32 minimum rather than -inf so that a fully masked (padding) row stays finite instead of NaN.
    """
    f32 = jnp.float32
    scores = jnp.einsum("btkgd,bksd->bkgts", q.astype(f32), k.astype(f32), precision=HIGHEST) * scale
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(f32).min)  # [B, n_kv, g, T, S]
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgts,bkds->btkgd", probs, v.astype(f32), precision=HIGHEST)
    return out.astype(q.dtype)  # [B, T, n_kv, g, d]


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
        self.scale = spec.head_dim**-0.5
        h, q_out, kv_out = spec.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        kw = dict(dtype=dtype, param_dtype=dtype, precision=HIGHEST, rngs=rngs)
        self.q_proj = Linear(h, q_out, use_bias=spec.attention_bias, **kw)
        self.k_proj = Linear(h, kv_out, use_bias=spec.attention_bias, **kw)
        self.v_proj = Linear(h, kv_out, use_bias=spec.attention_bias, **kw)
        self.o_proj = Linear(q_out, h, use_bias=False, **kw)
        if spec.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, spec.rms_norm_eps, dtype=dtype, kernels=kernels)
            self.k_norm = RMSNorm(self.head_dim, spec.rms_norm_eps, dtype=dtype, kernels=kernels)
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
        q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)  # [B, T, n, d]
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)  # [B, T, n_kv, d]
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)  # [B, T, n_kv, d]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if trace is not None:
            trace[f"layers.{self.layer_idx}.attn.q"] = q
            trace[f"layers.{self.layer_idx}.attn.k"] = k
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 3, 1)  # [B, n_kv, T, d], [B, n_kv, d, T]
        if cache is not None:
            cache, k, v = cache.update(self.layer_idx, k, v)  # [B, n_kv, S, d], [B, n_kv, d, S]: every slot
        out = attend(group_heads(q, self.num_kv_heads), k, v, mask, self.scale)  # [B, T, n_kv, g, d]
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim)), cache  # [B, T, H]
