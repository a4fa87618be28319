"""One decoder layer in the dual-variable residual flow (docs/design.md, "The dual-variable flow"): pre-norm
(Llama, Qwen, Mistral, sequential GPT-NeoX, the mixture-of-experts families, whose sparse layers hold a
SparseMoeBlock from torch_impl/moe.py in place of the MLP) or sandwich (Gemma 2/3: pre and post norms);
`decoder_layer` picks the spec's layer class, the plain-flow ones (post-norm OLMo 2, parallel GPT-NeoX) in
decoder_layer_plain.py.

Mirrors jax_impl/decoder_layer.py. A layer takes and returns (hidden, residual): the add of the
previous increment into the residual stream happens inside the next add_rms_norm, so the returned
hidden is the MLP's increment, not x2. Trace mode records the math variables x1 and x2 explicitly.

Sandwich: the post norms are plain norms of an increment (HF's names: `post_attention_layernorm` is the norm ON
the attention output), and the pre-norms fuse with the residual add: x1 = x + post_attn_norm(attn), then
pre_feedforward_layernorm(x1) is one add_rms_norm of the normed increment into the residual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from spec import ModelSpec
from torch_impl.attention import Attention
from torch_impl.decoder_layer_plain import ParallelDecoderLayer, PostNormDecoderLayer
from torch_impl.layernorm import make_norm
from torch_impl.mlp import MLP
from torch_impl.moe import SparseMoeBlock

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
        experts: range | None = None,
        ep_group: dist.ProcessGroup | None = None,
    ):
        """A sparse layer (`spec.is_sparse`) holds a SparseMoeBlock: `experts` are its rank's global expert
        indices (None: all), `ep_group` the expert-parallel group (torch_impl/expert_parallel.py)."""
        super().__init__()
        self.layer_idx = layer_idx
        self.sparse = spec.is_sparse(layer_idx)
        self.sandwich = spec.norm_placement == "sandwich"
        h = spec.hidden_size
        self.input_layernorm = make_norm(spec, h, kernels=kernels)
        self.self_attn = Attention(spec, layer_idx, kernels=kernels, tp=tp, group=group)
        self.post_attention_layernorm = make_norm(spec, h, kernels=kernels)
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(spec, h, kernels=kernels)
        if self.sparse:
            moe = dict(kernels=kernels, tp=tp, group=group, experts=experts, ep_group=ep_group)
            self.mlp = SparseMoeBlock(spec, layer_idx, **moe)
        else:
            self.mlp = MLP(spec, layer_idx, kernels=kernels, tp=tp, group=group)
        if self.sandwich:
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
        routing: dict[int, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`routing`: teacher-forced expert ids per sparse layer (CausalLM.forward checks them); a sparse layer
        uses its own entry, if any."""
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
        if self.sandwich:
            hidden = self.post_attention_layernorm(hidden)  # the normed increment
            if trace is not None:
                trace[f"{name}.attn_post_norm"] = hidden
            hidden, residual = self.pre_feedforward_layernorm(hidden, residual)  # residual is now x1
        else:
            hidden, residual = self.post_attention_layernorm(hidden, residual)  # residual is now x1
        if trace is not None:
            trace[f"{name}.x1"] = residual
            trace[f"{name}.post_attn_norm"] = hidden
        if self.sparse:
            hidden = self.mlp(hidden, trace, None if routing is None else routing.get(self.layer_idx))
        else:
            hidden = self.mlp(hidden, trace)  # an increment: x2 = hidden + residual, materialized later
        if trace is not None:
            trace[f"{name}.mlp_out"] = hidden
        if self.sandwich:
            hidden = self.post_feedforward_layernorm(hidden)
            if trace is not None:
                trace[f"{name}.mlp_post_norm"] = hidden
        if trace is not None:
            trace[f"{name}.x2"] = (hidden.float() + residual.float()).to(hidden.dtype)
        return hidden, residual


def decoder_layer(
    spec: ModelSpec,
    layer_idx: int,
    *,
    kernels: str = "reference",
    tp: int = 1,
    group: dist.ProcessGroup | None = None,
    experts: range | None = None,
    ep_group: dist.ProcessGroup | None = None,
) -> DecoderLayer | PostNormDecoderLayer | ParallelDecoderLayer:
    """The layer class of the spec's residual flow, built for layer `layer_idx` (mixture-of-experts exists for
    the pre-norm flow only: the spec refuses the others, so only DecoderLayer takes `experts`, `ep_group`)."""
    if spec.norm_placement == "post":
        cls = PostNormDecoderLayer
    elif spec.parallel_residual:
        cls = ParallelDecoderLayer
    else:
        return DecoderLayer(spec, layer_idx, kernels=kernels, tp=tp, group=group, experts=experts, ep_group=ep_group)
    return cls(spec, layer_idx, kernels=kernels, tp=tp, group=group)
