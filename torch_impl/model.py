"""The decoder (`Model`) and the causal LM with its (tied) head (`CausalLM`). Only composes layers.

Mirrors jax_impl/model.py. `CausalLM.forward` validates token ids at the boundary, builds positions and
the causal/padding mask once, runs the layers in the dual-variable flow, and applies the final norm
(which consumes the last layer's increment) and the head. A tied head is the embedding's Parameter
itself: `lm_head.weight is model.embed_tokens.weight`. With tp > 1 (torch_impl/tensor_parallel.py) the
modules hold this rank's shard, sized by `module_spec`, and the logits are this rank's vocabulary shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from kernels import resolve_kernels
from spec import ModelSpec, check_attention_mask, check_positions, check_token_ids
from torch_impl.decoder_layer import DecoderLayer
from torch_impl.embedding import Embedding
from torch_impl.layernorm import RMSNorm
from torch_impl.rotary_embedding import RotaryEmbedding
from torch_impl.tensor_parallel import column_linear, rank_layout
from torch_impl.vocab_parallel import mask_padding

if TYPE_CHECKING:
    from torch_impl.kv_cache import KVCache


def causal_mask(key_valid: torch.Tensor, q_start: int, q_len: int) -> torch.Tensor:
    """key_valid [B, S] bool; queries sit at slots q_start .. q_start + q_len - 1 -> mask [B, T, S]."""
    q_slot = q_start + torch.arange(q_len, device=key_valid.device)  # [T]
    k_slot = torch.arange(key_valid.shape[1], device=key_valid.device)  # [S]
    return (k_slot[None, :] <= q_slot[:, None])[None] & key_valid[:, None, :]  # [B, T, S]


def default_positions(key_valid: torch.Tensor, q_start: int, q_len: int) -> torch.Tensor:
    """Position of each query: its count of valid slots before it, so left padding does not shift RoPE."""
    positions = (key_valid.long().cumsum(-1) - 1).clamp(min=0)  # [B, S]
    return positions[:, q_start : q_start + q_len]  # [B, T]


class Model(nn.Module):
    def __init__(
        self, spec: ModelSpec, *, kernels: str = "reference", tp: int = 1, group: dist.ProcessGroup | None = None
    ):
        super().__init__()
        layout = rank_layout(spec, tp, group)
        self.spec = local = layout.local_spec  # this rank's heads, features and vocabulary rows
        h = spec.hidden_size
        self.embed_tokens = Embedding(local.vocab_size, h, tp=tp, vocab_start=layout.vocab_start, group=group)
        self.layers = nn.ModuleList(
            DecoderLayer(local, i, kernels=kernels, tp=tp, group=group) for i in range(spec.num_hidden_layers)
        )
        self.norm = RMSNorm(h, spec.rms_norm_eps, kernels=kernels)
        self.rotary_emb = RotaryEmbedding(spec)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
        last_only: bool = False,
        trace: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # [B, T, H]
        if trace is not None:
            trace["embed"] = hidden
        cos, sin = self.rotary_emb(positions)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos, sin, mask, cache, trace)
        if last_only:  # the norm and head are per position: only the last one is needed
            hidden, residual = hidden[:, -1:], residual[:, -1:]  # [B, 1, H]
        hidden, _ = self.norm(hidden, residual)  # consumes the last increment: norm(x2 of the last layer)
        if trace is not None:
            trace["final_norm"] = hidden
        return hidden


class CausalLM(nn.Module):
    def __init__(
        self, spec: ModelSpec, *, kernels: str = "reference", tp: int = 1, group: dist.ProcessGroup | None = None
    ):
        """`spec` is the whole model's (ids and positions are checked against it); tp > 1 builds this rank's
        shard in process `group` (the degree is the group's size)."""
        super().__init__()
        self.spec = spec
        self.layout = rank_layout(spec, tp, group)
        self.module_spec = self.layout.local_spec  # what the modules and the KV cache are sized by
        self.group = group
        self.kernels = resolve_kernels(kernels, on_gpu=torch.cuda.is_available())
        self.model = Model(spec, kernels=self.kernels, tp=tp, group=group)
        self.lm_head = column_linear(spec.hidden_size, self.module_spec.vocab_size, False, tp, group)
        self.eos_token_ids: tuple[int, ...] = ()  # set by the loader from the checkpoint
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight  # one Parameter, not a copy

    def forward(
        self,
        input_ids: torch.Tensor | np.ndarray | list,
        *,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
        trace: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Token ids [B, T] -> logits [B, T, V] ([B, 1, V] with `last_only`).

        attention_mask [B, past + T] marks real tokens (1) and padding (0) over every cached slot too.
        """
        device = self.model.embed_tokens.weight.device
        past = cache.length if cache is not None else 0
        ids = torch.as_tensor(check_token_ids(input_ids, self.spec, past_length=past), device=device)
        b, t = ids.shape
        key_valid = self._key_valid(attention_mask, b, past + t, device)
        if positions is None:
            positions = default_positions(key_valid, past, t)
        else:  # numpy or torch, any integer dtype; each inside the RoPE range (spec/inputs.py)
            positions = torch.as_tensor(check_positions(positions, self.spec, b, t), device=device)
        mask = causal_mask(key_valid, past, t)
        hidden = self.model(ids, positions, mask, cache, last_only, trace)
        if cache is not None:
            cache.advance(t)
        logits = self.lm_head(hidden)  # tied: the embedding table itself, F.linear(x, E)
        if self.layout.padded_vocab != self.spec.vocab_size:  # padding rows of a sharded vocabulary: never chosen
            logits = mask_padding(logits, self.layout.vocab_start, self.spec.vocab_size)
        if trace is not None:
            trace["logits"] = logits
        return logits

    @staticmethod
    def _key_valid(attention_mask: torch.Tensor | None, batch: int, length: int, device: torch.device) -> torch.Tensor:
        if attention_mask is None:
            return torch.ones(batch, length, dtype=torch.bool, device=device)
        return torch.as_tensor(check_attention_mask(attention_mask, batch, length), device=device)
