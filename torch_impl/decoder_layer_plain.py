"""Decoder layers in the plain residual flow, where no norm can fuse with the residual add: post-norm (OLMo 2)
and parallel residual (GPT-NeoX).

Mirrors jax_impl/decoder_layer_plain.py. A plain-flow layer takes (hidden, residual=None) with hidden the
layer's input x, and returns (x_new, None), so the model's loop and its final `norm(hidden, residual)` run
unchanged (docs/design.md, "The dual-variable flow"): the stream is carried whole, added where it is made.

    post-norm:  x1 = x + post_attention_layernorm(attn(x));  x2 = x1 + post_feedforward_layernorm(mlp(x1))
    parallel:   x2 = (mlp(post_attention_layernorm(x)) + attn(input_layernorm(x))) + x

Each add is one rounding in the activation dtype, in transformers' order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from spec import ModelSpec
from torch_impl.attention import Attention
from torch_impl.layernorm import make_norm
from torch_impl.mlp import MLP

if TYPE_CHECKING:
    from torch_impl.kv_cache import KVCache


def _plain_input(residual: torch.Tensor | None) -> None:
    if residual is not None:
        raise AssertionError("a plain-flow layer carries the residual stream whole: residual must be None")


class PostNormDecoderLayer(nn.Module):
    """OLMo 2: no norm on the layer's input; each sublayer's output is normed, then added."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        *,
        kernels: str = "reference",
        tp: int = 1,
        group: dist.ProcessGroup | None = None,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        h = spec.hidden_size
        self.self_attn = Attention(spec, layer_idx, kernels=kernels, tp=tp, group=group)
        self.post_attention_layernorm = make_norm(spec, h, kernels=kernels)
        self.mlp = MLP(spec, layer_idx, kernels=kernels, tp=tp, group=group)
        self.post_feedforward_layernorm = make_norm(spec, h, kernels=kernels)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
        trace: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, None]:
        _plain_input(residual)
        name = f"layers.{self.layer_idx}"
        attn = self.self_attn(hidden, cos, sin, mask, cache, trace)
        normed = self.post_attention_layernorm(attn)
        x1 = hidden + normed
        if trace is not None:
            trace[f"{name}.attn_out"] = attn
            trace[f"{name}.attn_post_norm"] = normed
            trace[f"{name}.x1"] = x1
        mlp = self.mlp(x1, trace)
        normed = self.post_feedforward_layernorm(mlp)
        x2 = x1 + normed
        if trace is not None:
            trace[f"{name}.mlp_out"] = mlp
            trace[f"{name}.mlp_post_norm"] = normed
            trace[f"{name}.x2"] = x2
        return x2, None


class ParallelDecoderLayer(nn.Module):
    """GPT-NeoX with use_parallel_residual: attention and MLP both read x (each through its own norm)."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        *,
        kernels: str = "reference",
        tp: int = 1,
        group: dist.ProcessGroup | None = None,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        h = spec.hidden_size
        self.input_layernorm = make_norm(spec, h, kernels=kernels)
        self.self_attn = Attention(spec, layer_idx, kernels=kernels, tp=tp, group=group)
        self.post_attention_layernorm = make_norm(spec, h, kernels=kernels)
        self.mlp = MLP(spec, layer_idx, kernels=kernels, tp=tp, group=group)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
        trace: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, None]:
        _plain_input(residual)
        name = f"layers.{self.layer_idx}"
        attn_in = self.input_layernorm(hidden)
        if trace is not None:
            trace[f"{name}.input_norm"] = attn_in
        attn = self.self_attn(attn_in, cos, sin, mask, cache, trace)
        mlp_in = self.post_attention_layernorm(hidden)
        if trace is not None:
            trace[f"{name}.attn_out"] = attn
            trace[f"{name}.post_attn_norm"] = mlp_in
        mlp = self.mlp(mlp_in, trace)
        x2 = (mlp + attn) + hidden  # transformers' order: mlp_output + attn_output + hidden_states
        if trace is not None:
            trace[f"{name}.mlp_out"] = mlp
            trace[f"{name}.x2"] = x2
        return x2, None
