"""Grouped-query causal self-attention with RoPE and Qwen3's per-head q/k RMSNorm.

Mirrors jax_impl/attention.py. q/k/v projections (bias where the spec says so), per-head RMSNorm on q and
k before RoPE (Qwen3), rotate-half RoPE, key/value heads shared by `num_kv_groups` consecutive query
heads (query head h reads kv head h // groups: Hugging Face's repeat_kv, i.e. repeat_interleave, done as a
reshape of the queries so the keys and values are never copied), scores and softmax in float32.
An optional KV cache receives this step's keys and values and returns every cached one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from spec import ModelSpec
from torch_impl.layernorm import RMSNorm
from torch_impl.rotary_embedding import apply_rotary
from torch_impl.tensor_parallel import column_linear, row_linear

if TYPE_CHECKING:
    from torch_impl.kv_cache import KVCache


def group_heads(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[B, T, n, d] -> [B, T, n_kv, groups, d]: query head h = kv * groups + g reads kv head h // groups.

    The same mapping as repeat_interleave of the keys (Hugging Face's repeat_kv), without copying them.
    """
    b, t, n, d = q.shape
    return q.view(b, t, num_kv_heads, n // num_kv_heads, d)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, T, n_kv, g, d] (grouped), k [B, n_kv, S, d], v [B, n_kv, d, S], mask [B, T, S] bool (True = may
    attend): the KV cache's layouts (kv_cache.py says why).

    Returns [B, T, n_kv, g, d]. Scores, softmax and the weighted sum run in float32; masked scores get the
    float32 minimum rather than -inf so that a fully masked (padding) row stays finite instead of NaN.
    """
    scores = torch.einsum("btkgd,bksd->bkgts", q.float(), k.float()) * scale  # [B, n_kv, g, T, S]
    scores = scores.masked_fill(~mask[:, None, None], torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bkgts,bkds->btkgd", probs, v.float()).to(q.dtype)  # [B, T, n_kv, g, d]


class Attention(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        *,
        kernels: str = "reference",
        tp: int = 1,
        group: dist.ProcessGroup | None = None,
    ):
        """`spec` sizes this rank's heads (ShardLayout.local_spec); tp > 1 makes o_proj row-parallel."""
        super().__init__()
        self.layer_idx = layer_idx
        self.group = group if tp > 1 else None
        self.num_heads, self.num_kv_heads, self.head_dim = (
            spec.num_attention_heads,
            spec.num_key_value_heads,
            spec.head_dim,
        )
        self.scale = spec.head_dim**-0.5
        h, q_out, kv_out = spec.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = column_linear(h, q_out, spec.attention_bias, tp, group)
        self.k_proj = column_linear(h, kv_out, spec.attention_bias, tp, group)
        self.v_proj = column_linear(h, kv_out, spec.attention_bias, tp, group)
        self.o_proj = row_linear(q_out, h, tp, group)
        if spec.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, spec.rms_norm_eps, kernels=kernels)
            self.k_norm = RMSNorm(self.head_dim, spec.rms_norm_eps, kernels=kernels)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
        trace: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)  # [B, T, n, d]
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)  # [B, T, n_kv, d]
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)  # [B, T, n_kv, d]
        if self.q_norm is not None:  # per head: with tp > 1 each rank's heads give part of the weights' gradient
            q, k = self.q_norm(q, group=self.group), self.k_norm(k, group=self.group)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if trace is not None:
            trace[f"layers.{self.layer_idx}.attn.q"] = q
            trace[f"layers.{self.layer_idx}.attn.k"] = k
        k, v = k.transpose(1, 2), v.permute(0, 2, 3, 1)  # [B, n_kv, T, d], [B, n_kv, d, T]
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # [B, n_kv, S, d], [B, n_kv, d, S]: every cached position
        out = attend(group_heads(q, self.num_kv_heads), k, v, mask, self.scale)  # [B, T, n_kv, g, d]
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim))  # [B, T, H]
