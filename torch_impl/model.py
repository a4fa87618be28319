"""The decoder (`Model`) and the causal LM with its (tied) head (`CausalLM`). Only composes layers.

Mirrors jax_impl/model.py. `CausalLM.forward` validates token ids at the boundary, builds positions and
the causal/padding masks once (one per layer kind: full, and sliding where the spec has a window; with a KV
cache a sliding mask covers the ring's slots and this step's, kv_cache.py), runs the
layers in the dual-variable flow (or the plain flow of decoder_layer_plain.py), and applies the final norm
(which consumes the last layer's increment), the head and the final soft-cap (Gemma 2). The embedding is
scaled by sqrt(hidden) where the spec says so (Gemma); RoPE tables are made once per kind (Gemma 3's sliding
layers have their own). A tied head is the embedding's Parameter itself: `lm_head.weight is
model.embed_tokens.weight`. With tp > 1 (torch_impl/tensor_parallel.py) the modules hold this rank's shard,
sized by `module_spec`, and the logits are this rank's vocabulary shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from kernels import resolve_kernels
from kernels.cpu import torch_decode_stack
from spec import ModelSpec, check_attention_mask, check_positions, check_token_ids
from spec.families import FULL, SLIDING
from torch_impl.decoder_layer import DecoderLayer, decoder_layer
from torch_impl.embedding import Embedding
from torch_impl.expert_parallel import rank_experts
from torch_impl.layernorm import make_norm
from torch_impl.moe import check_routing
from torch_impl.rotary_embedding import RotaryEmbedding
from torch_impl.tensor_parallel import column_linear, rank_layout
from torch_impl.vocab_parallel import mask_padding

if TYPE_CHECKING:
    from torch_impl.kv_cache import KVCache


def causal_mask(
    key_valid: torch.Tensor,
    q_start: int,
    q_len: int,
    window: int | None = None,
    k_slot: torch.Tensor | None = None,
) -> torch.Tensor:
    """key_valid [B, slots] bool; queries sit at slots q_start .. q_start + q_len - 1 -> mask [B, T, S].

    Key j sits at slot j, or at k_slot[j] ([S] int, -1 = empty: a ring cache's `key_slots`). With a `window` a
    query at slot q sees keys at slots q - window < k <= q (transformers' sliding_window_overlay): slots, so
    left padding counts, as it does in transformers."""
    q_slot = q_start + torch.arange(q_len, device=key_valid.device)  # [T]
    if k_slot is None:
        k_slot, valid = torch.arange(key_valid.shape[1], device=key_valid.device), key_valid  # [S], [B, S]
    else:
        valid = key_valid[:, k_slot.clamp(min=0)] & (k_slot >= 0)  # [B, S]: padding looked up by absolute slot
    allowed = k_slot[None, :] <= q_slot[:, None]  # [T, S]
    if window is not None:
        allowed = allowed & (k_slot[None, :] > q_slot[:, None] - window)
    return allowed[None] & valid[:, None, :]  # [B, T, S]


def attention_masks(
    spec: ModelSpec, key_valid: torch.Tensor, q_start: int, q_len: int, cache: KVCache | None = None
) -> dict[str, torch.Tensor]:
    """One mask per layer type the spec's layers use (full: causal; sliding: causal within the window). With a
    `cache`, a sliding layer's keys are its ring and this step's (kv_cache.py): the mask follows their slots."""
    kinds = sorted({spec.layer_type(i) for i in range(spec.num_hidden_layers)})
    masks = {}
    for kind in kinds:
        if kind == SLIDING:
            k_slot = None if cache is None else cache.key_slots(q_len)
            masks[kind] = causal_mask(key_valid, q_start, q_len, spec.sliding_window, k_slot)
        else:
            masks[kind] = causal_mask(key_valid, q_start, q_len)
    return masks


def default_positions(key_valid: torch.Tensor, q_start: int, q_len: int) -> torch.Tensor:
    """Position of each query: its count of valid slots before it, so left padding does not shift RoPE."""
    positions = (key_valid.long().cumsum(-1) - 1).clamp(min=0)  # [B, S]
    return positions[:, q_start : q_start + q_len]  # [B, T]


def embedding_scale(spec: ModelSpec, dtype: torch.dtype) -> torch.Tensor:
    """Gemma's embedding factor: sqrt(hidden) as float32, rounded to the activation dtype (as transformers)."""
    return torch.tensor(spec.hidden_size**0.5, dtype=torch.float32).to(dtype)


def final_softcap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma 2's final soft-cap: cap * tanh(logits / cap) in float32, then the logits' dtype."""
    return (torch.tanh(logits.float() / cap) * cap).to(logits.dtype)


class Model(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        *,
        kernels: str = "reference",
        tp: int = 1,
        group: dist.ProcessGroup | None = None,
        ep_group: dist.ProcessGroup | None = None,
    ):
        super().__init__()
        layout = rank_layout(spec, tp, group)
        self.spec = local = layout.local_spec  # this rank's heads, features and vocabulary rows
        h = spec.hidden_size
        self.embed_tokens = Embedding(
            local.vocab_size, h, tp=tp, vocab_start=layout.vocab_start, group=group, pad_token_id=spec.pad_token_id
        )
        moe = dict(experts=rank_experts(spec, ep_group), ep_group=ep_group)
        self.layers = nn.ModuleList(
            decoder_layer(local, i, kernels=kernels, tp=tp, group=group, **moe) for i in range(spec.num_hidden_layers)
        )
        self.norm = make_norm(spec, h, kernels=kernels)
        self.rotary_emb = RotaryEmbedding(spec)
        self._stack: torch_decode_stack.LayerStack | None = None  # the last decode step's, kept while it holds
        if SLIDING in spec.rope_kinds:  # sliding layers' own frequencies (Gemma 3's local base)
            self.rotary_emb_local = RotaryEmbedding(spec, SLIDING)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        masks: dict[str, torch.Tensor],
        cache: KVCache | None = None,
        last_only: bool = False,
        trace: dict[str, torch.Tensor] | None = None,
        routing: dict[int, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """masks: `attention_masks(spec, ...)`, one per layer type; routing: checked teacher-forced expert ids."""
        hidden = self.embed_tokens(input_ids)  # [B, T, H]
        if self.spec.embedding_scale:  # Gemma: sqrt(H) as float32, rounded to the activation dtype, then multiplied
            hidden = hidden * embedding_scale(self.spec, hidden.dtype)
        if trace is not None:
            trace["embed"] = hidden
        ropes = {FULL: self.rotary_emb(positions)}  # (cos, sin) per layer type with its own frequencies
        if SLIDING in self.spec.rope_kinds:
            ropes[SLIDING] = self.rotary_emb_local(positions)
        stack = None if trace is not None or routing is not None else self._decode_stack(hidden, cache)
        if stack is not None:  # every layer's decode step prepared for decode_layer.c: the layers in one call
            hidden, residual = stack(hidden, *ropes[FULL], cache.length, masks[FULL])
        else:
            residual = None
            for i, layer in enumerate(self.layers):
                kind = self.spec.layer_type(i)
                cos, sin = ropes.get(kind, ropes[FULL])
                forced = {} if routing is None else {"routing": routing}  # sparse layers exist in DecoderLayer only
                hidden, residual = layer(hidden, residual, cos, sin, masks[kind], cache, trace, **forced)
        if last_only:  # the norm and head are per position: only the last one is needed
            hidden = hidden[:, -1:]  # [B, 1, H]
            residual = None if residual is None else residual[:, -1:]
        if residual is None:  # the plain flow (post-norm, parallel residual): hidden is x2 itself
            hidden = self.norm(hidden)
        else:
            hidden, _ = self.norm(hidden, residual)  # consumes the last increment: norm(x2 of the last layer)
        if trace is not None:
            trace["final_norm"] = hidden
        return hidden

    def _decode_stack(self, hidden: torch.Tensor, cache: KVCache | None) -> torch_decode_stack.LayerStack | None:
        """The layers' decode steps as one LayerStack, where every layer has a call prepared at an earlier step that
        still stands (DecoderLayer.prepared_step); None otherwise: the layers run one by one (and prepare)."""
        if cache is None:
            return None
        calls = []
        for layer in self.layers:
            call = layer.prepared_step(hidden, cache) if isinstance(layer, DecoderLayer) else None
            if call is None:
                return None
            calls.append(call)
        if self._stack is None or not self._stack.holds(calls):
            self._stack = torch_decode_stack.LayerStack(calls)
        return self._stack


class CausalLM(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        *,
        kernels: str = "reference",
        tp: int = 1,
        group: dist.ProcessGroup | None = None,
        ep_group: dist.ProcessGroup | None = None,
    ):
        """`spec` is the whole model's (ids and positions are checked against it); tp > 1 builds this rank's
        shard in process `group` (the degree is the group's size). `ep_group`: the expert-parallel group
        (torch_impl/expert_parallel.py); this rank holds its run of each sparse layer's experts."""
        super().__init__()
        self.spec = spec
        self.layout = rank_layout(spec, tp, group)
        self.module_spec = self.layout.local_spec  # what the modules and the KV cache are sized by
        self.group, self.ep_group = group, ep_group
        self.experts = rank_experts(spec, ep_group)
        self.kernels = resolve_kernels(kernels, on_gpu=torch.cuda.is_available())
        self.model = Model(spec, kernels=self.kernels, tp=tp, group=group, ep_group=ep_group)
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
        routing: dict[int, torch.Tensor | np.ndarray] | None = None,
    ) -> torch.Tensor:
        """Token ids [B, T] -> logits [B, T, V] ([B, 1, V] with `last_only`).

        attention_mask [B, past + T] marks real tokens (1) and padding (0) over every cached slot too.
        routing: teacher-forced expert ids, sparse layer index -> [B, T, k] integers in [0, num_experts): that
        layer uses them instead of its top-k, weighted by its own probabilities at them (torch_impl/moe.py).
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
        masks = attention_masks(self.spec, key_valid, past, t, cache)
        routing = check_routing(routing, self.spec, b, t, device)
        hidden = self.model(ids, positions, masks, cache, last_only, trace, routing)
        if cache is not None:
            cache.advance(t)
        logits = self.lm_head(hidden)  # tied: the embedding table itself, F.linear(x, E)
        cap = self.spec.final_logit_softcapping
        if cap is not None:  # before the padding mask, which must stay -inf
            if trace is not None:
                trace["head"] = logits
            logits = final_softcap(logits, cap)
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
