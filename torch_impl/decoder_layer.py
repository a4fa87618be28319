"""One pre-norm decoder layer in the dual-variable residual flow (docs/design.md, "The dual-variable flow").

Mirrors jax_impl/decoder_layer.py. A layer takes and returns (hidden, residual): the add of the
previous increment into the residual stream happens inside the next add_rms_norm, so the returned
hidden is the MLP's increment, not x2. Trace mode records the math variables x1 and x2 explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from spec import ModelSpec
from torch_impl.attention import Attention
from torch_impl.layernorm import RMSNorm
from torch_impl.mlp import MLP

if TYPE_CHECKING:
    from torch_impl.kv_cache import KVCache


class DecoderLayer(nn.Module):
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
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, kernels=kernels)
        self.self_attn = Attention(spec, layer_idx, kernels=kernels, tp=tp, group=group)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, kernels=kernels)
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
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:  # layer 0: the residual stream starts as the embedding h0
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:  # residual := previous increment + residual (= the previous layer's x2)
            hidden, residual = self.input_layernorm(hidden, residual)
        name = f"layers.{self.layer_idx}"
        if trace is not None:
            trace[f"{name}.input_norm"] = hidden
        hidden = self.self_attn(hidden, cos, sin, mask, cache, trace)
        if trace is not None:
            trace[f"{name}.attn_out"] = hidden
        hidden, residual = self.post_attention_layernorm(hidden, residual)  # residual is now x1
        if trace is not None:
            trace[f"{name}.x1"] = residual
            trace[f"{name}.post_attn_norm"] = hidden
        hidden = self.mlp(hidden, trace)  # an increment: x2 = hidden + residual, materialized later
        if trace is not None:
            trace[f"{name}.mlp_out"] = hidden
            trace[f"{name}.x2"] = (hidden.float() + residual.float()).to(hidden.dtype)
        return hidden, residual
