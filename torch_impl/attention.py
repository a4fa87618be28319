"""Grouped-query causal self-attention with RoPE, q/k norms, soft-capped scores and sliding windows.

Mirrors jax_impl/attention.py. q/k/v projections, separate or one per-head `qkv_proj` (GPT-NeoX), with a bias
where the spec says so; q/k norms before RoPE, per head over d (Qwen3, Gemma 3) or over the whole projection
before the view into heads (OLMo 2); rotate-half RoPE, full or partial; key/value heads shared by
`num_kv_groups` consecutive query heads (query head h reads kv head h // groups: Hugging Face's repeat_kv,
i.e. repeat_interleave, done as a reshape of the queries so the keys and values are never copied); scores
scaled by spec.attention_scale, soft-capped (Gemma 2), softmax in float32; an o_proj bias (GPT-NeoX) added once.
The layer's window comes in through its mask (the model builds one per layer kind). An optional KV cache
receives this step's keys and values and returns the ones to attend over: every cached one, or on a sliding
layer its ring of the window's slots and this step's (kv_cache.py; the mask follows their slots). In a CPU decode
step the per-head q/k norms with RoPE, and the attention, are one C call each (kernels/cpu/torch_decode_ops.py, the
same math); jax_impl takes only the attention's (XLA fuses the rest of its step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from kernels.cpu import torch_decode_ops
from spec import ModelSpec
from torch_impl.layernorm import RMSNorm, make_norm
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


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """q [B, T, n_kv, g, d] (grouped), k [B, n_kv, S, d], v [B, n_kv, d, S], mask [B, T, S] bool (True = may
    attend): the KV cache's layouts (kv_cache.py says why).

    Returns [B, T, n_kv, g, d]. Scores, softmax and the weighted sum run in float32; masked scores get the
    float32 minimum rather than -inf so that a fully masked (padding) row stays finite instead of NaN.
    `softcap` (Gemma 2): scores -> cap * tanh(scores / cap) after the scale, before the mask. A kv head's g query
    heads are one block of g * T rows, so each product is one matrix product per kv head (the same dot products
    as g * T separate ones, in less time).
    """
    if torch_decode_ops.takes_attention(q, k, v):  # a decode step's few rows: this math in one C call per batch row
        return torch_decode_ops.attend(q, k, v, mask, scale, softcap)
    b, t, n_kv, g, d = q.shape
    # widened first: torch has no bf16 product with float32 sums on the CPU (jax_impl dots bf16 q and k as they are,
    # the same math)
    rows = q.float().permute(0, 2, 3, 1, 4).reshape(b, n_kv, g * t, d)  # [B, n_kv, g*T, d]
    scores = (rows @ k.float().transpose(-1, -2)).view(b, n_kv, g, t, -1) * scale  # [B, n_kv, g, T, S]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask[:, None, None], torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).view(b, n_kv, g * t, -1)  # [B, n_kv, g*T, S]
    out = probs @ v.float().transpose(-1, -2)  # [B, n_kv, g*T, d]
    return out.view(b, n_kv, g, t, d).permute(0, 3, 1, 2, 4).to(q.dtype)  # [B, T, n_kv, g, d]


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
        self.scale, self.softcap = spec.attention_scale, spec.attn_logit_softcapping
        self.fused_qkv, self.projection_norm = spec.fused_qkv, spec.qk_norm_scope == "projection"
        h, q_out, kv_out = spec.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.fused_qkv:  # rows [n, 3, d]: each head's q, k and v together (GPT-NeoX)
            self.qkv_proj = column_linear(h, 3 * q_out, spec.attention_bias, tp, group)
        else:
            self.q_proj = column_linear(h, q_out, spec.attention_bias, tp, group)
            self.k_proj = column_linear(h, kv_out, spec.attention_bias, tp, group)
            self.v_proj = column_linear(h, kv_out, spec.attention_bias, tp, group)
        self.o_proj = row_linear(q_out, h, tp, group, spec.o_proj_bias)
        if spec.qk_norm:  # over d, one weight for every head; or over the whole projection (OLMo 2)
            q_dim, k_dim = (q_out, kv_out) if self.projection_norm else (self.head_dim, self.head_dim)
            self.q_norm = make_norm(spec, q_dim, kernels=kernels)
            self.k_norm = make_norm(spec, k_dim, kernels=kernels)
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
        q, k, v = self._project(x)  # [B, T, n, d], [B, T, n_kv, d], [B, T, n_kv, d]
        q, k = self._norm_and_rotate(q, k, cos, sin)
        if trace is not None:
            trace[f"layers.{self.layer_idx}.attn.q"] = q
            trace[f"layers.{self.layer_idx}.attn.k"] = k
        k, v = k.transpose(1, 2), v.permute(0, 2, 3, 1)  # [B, n_kv, T, d], [B, n_kv, d, T]
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # [B, n_kv, S, d], [B, n_kv, d, S]: cached (or ring) + new
        out = attend(group_heads(q, self.num_kv_heads), k, v, mask, self.scale, self.softcap)  # [B, T, n_kv, g, d]
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim))  # [B, T, H]

    def _norm_and_rotate(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head q/k norms (where the spec has them), then RoPE; in CPU generation, all four in one C call."""
        per_head = self.q_norm is not None and not self.projection_norm
        if per_head and self._one_call(q, k):
            qn, kn = self.q_norm, self.k_norm  # one spec built both: the same eps and options
            return torch_decode_ops.norm_rotary(q, k, qn.weight, kn.weight, qn.eps, cos, sin, **qn.options)
        if per_head:  # with tp > 1 each rank's heads give part of the weights' gradient
            q, k = self.q_norm(q, group=self.group), self.k_norm(k, group=self.group)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def _one_call(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether the norms and RoPE run as torch_decode_ops.norm_rotary: RMSNorms on the reference path (not the
        Triton kernel) over this process's own heads, where the decode-step rule (`takes`) holds."""
        return (
            self.group is None
            and isinstance(self.q_norm, RMSNorm)
            and self.q_norm.kernels == "reference"
            and torch_decode_ops.takes(q, k, self.q_norm.weight, self.k_norm.weight)
        )

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of x [B, T, H] as heads; a projection-scope q/k norm is applied here, before the view."""
        b, t, _ = x.shape
        n, n_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.fused_qkv:
            qkv = self.qkv_proj(x).view(b, t, n, 3 * d)  # [B, T, n, 3d]: q, k, v of each head side by side
            return qkv.split(d, dim=-1)  # 3 x [B, T, n, d]
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # [B, T, n * d], [B, T, n_kv * d] x 2
        if self.projection_norm and self.q_norm is not None:  # tp > 1: a rank holds part of the row (all-reduced)
            q, k = self.q_norm(q, row_group=self.group), self.k_norm(k, row_group=self.group)
        return q.view(b, t, n, d), k.view(b, t, n_kv, d), v.view(b, t, n_kv, d)  # [B, T, heads, d]
