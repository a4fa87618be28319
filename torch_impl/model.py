"""The decoder (`Model`) and the causal LM with its (tied) head (`CausalLM`). Only composes layers.

Mirrors jax_impl/model.py. `CausalLM.forward` validates token ids at the boundary, builds positions and
the causal/padding mask once, runs the layers in the dual-variable flow, and applies the final norm
(which consumes the last layer's increment) and the head. A tied head is the embedding's Parameter
itself: `lm_head.weight is model.embed_tokens.weight`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from kernels import resolve_kernels
from spec import InputError, ModelSpec, check_token_ids
from torch_impl.decoder_layer import DecoderLayer
from torch_impl.embedding import Embedding
from torch_impl.layernorm import RMSNorm
from torch_impl.linear import Linear
from torch_impl.rotary_embedding import RotaryEmbedding

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
    def __init__(self, spec: ModelSpec, *, kernels: str = "reference"):
        super().__init__()
        self.spec = spec
        self.embed_tokens = Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, kernels=kernels) for i in range(spec.num_hidden_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, kernels=kernels)
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
    def __init__(self, spec: ModelSpec, *, kernels: str = "reference"):
        super().__init__()
        self.spec = spec
        self.kernels = resolve_kernels(kernels, on_gpu=torch.cuda.is_available())
        self.model = Model(spec, kernels=self.kernels)
        self.lm_head = Linear(spec.hidden_size, spec.vocab_size, bias=False)
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
        ids = input_ids.detach().cpu().numpy() if torch.is_tensor(input_ids) else np.asarray(input_ids)
        ids = torch.as_tensor(check_token_ids(ids, self.spec, past_length=past), device=device)
        b, t = ids.shape
        key_valid = self._key_valid(attention_mask, b, past + t, device)
        if positions is None:
            positions = default_positions(key_valid, past, t)
        mask = causal_mask(key_valid, past, t)
        hidden = self.model(ids, positions, mask, cache, last_only, trace)
        if cache is not None:
            cache.advance(t)
        logits = self.lm_head(hidden)  # tied: the embedding table itself, F.linear(x, E)
        if trace is not None:
            trace["logits"] = logits
        return logits

    @staticmethod
    def _key_valid(attention_mask: torch.Tensor | None, batch: int, length: int, device: torch.device) -> torch.Tensor:
        if attention_mask is None:
            return torch.ones(batch, length, dtype=torch.bool, device=device)
        mask = torch.as_tensor(attention_mask, device=device)
        if tuple(mask.shape) != (batch, length):
            raise InputError(
                f"attention_mask has shape {list(mask.shape)}, expected [{batch}, {length}] "
                "(batch, cached + new tokens)"
            )
        return mask.bool()
