"""The decoder (`Model`) and the causal LM with its (tied) head (`CausalLM`). Only composes layers.

Mirrors torch_impl/model.py. Per forward, one attention mask per layer kind (full, sliding window; with a KV cache
a sliding mask covers the ring's slots and this step's, kv_cache.py) and one RoPE
table per kind with its own frequencies (spec.rope_kinds) are built once and handed to each layer; the embedding
is scaled where the family does (Gemma), and the head's logits soft-capped (Gemma 2). `CausalLM.__call__`
validates token ids at the boundary on the host, then runs one jit-compiled entry point (`forward`) on the split
graph and state. A tied model has no head
parameter: logits are `embed_tokens.attend(x)`, x @ E^T with the embedding Param itself. With tp > 1
(jax_impl/tensor_parallel.py) the modules are sized by `module_spec`, every rank's shards side by side, and
the loader places each device's slice.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_impl.decoder_layer import decoder_layer
from jax_impl.embedding import HIGHEST, Embedding
from jax_impl.layernorm import make_norm
from jax_impl.linear import Linear
from jax_impl.moe import check_routing
from jax_impl.rotary_embedding import RotaryEmbedding
from jax_impl.vocab_parallel import mask_padding
from kernels import resolve_kernels
from spec import ModelSpec, check_attention_mask, check_positions, check_token_ids
from spec.families import FULL, SLIDING
from spec.parallel import ShardLayout, check_ep_degree

if TYPE_CHECKING:
    from jax_impl.kv_cache import KVCache


Masks = dict[str, jax.Array]  # layer type (FULL, SLIDING) -> its attention mask [B, T, S]
Routing = dict[int, jax.Array]  # sparse layer index -> teacher-forced expert ids [B, T, k]


def causal_mask(
    key_valid: jax.Array,
    q_start: jax.Array | int,
    q_len: int,
    window: int | None = None,
    k_slot: jax.Array | None = None,
) -> jax.Array:
    """key_valid [B, slots] bool; queries sit at slots q_start .. q_start + q_len - 1 -> mask [B, T, S].

    Key j sits at slot j, or at k_slot[j] ([S] int, -1 = empty: a ring cache's `key_slots`). With a `window` a
    query at slot q sees keys at slots q - window < k <= q (transformers' sliding_window_overlay): slots, so
    left padding counts, as it does in transformers."""
    q_slot = q_start + jnp.arange(q_len)  # [T]
    if k_slot is None:
        k_slot, valid = jnp.arange(key_valid.shape[1]), key_valid  # [S], [B, S]
    else:
        valid = key_valid[:, jnp.maximum(k_slot, 0)] & (k_slot >= 0)  # [B, S]: padding looked up by absolute slot
    allowed = k_slot[None, :] <= q_slot[:, None]  # [T, S]
    if window is not None:
        allowed = allowed & (k_slot[None, :] > q_slot[:, None] - window)
    return allowed[None] & valid[:, None, :]  # [B, T, S]


def attention_masks(
    spec: ModelSpec, key_valid: jax.Array, q_start: jax.Array | int, q_len: int, cache: KVCache | None = None
) -> Masks:
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


def default_positions(key_valid: jax.Array, q_start: jax.Array | int, q_len: int) -> jax.Array:
    """Position of each query: its count of valid slots before it, so left padding does not shift RoPE."""
    positions = jnp.maximum(jnp.cumsum(key_valid.astype(jnp.int32), axis=-1) - 1, 0)  # [B, S]
    return jax.lax.dynamic_slice_in_dim(positions, q_start, q_len, axis=1)  # [B, T]


def embedding_scale(spec: ModelSpec, dtype: jnp.dtype) -> jax.Array:
    """Gemma's embedding factor: sqrt(hidden) as float32, rounded to the activation dtype (as transformers)."""
    return jnp.asarray(np.float32(spec.hidden_size**0.5), dtype)


def final_softcap(logits: jax.Array, cap: float) -> jax.Array:
    """Gemma 2's final soft-cap: cap * tanh(logits / cap) in float32, then the logits' dtype."""
    return (jnp.tanh(logits.astype(jnp.float32) / cap) * cap).astype(logits.dtype)


class Model(nnx.Module):
    def __init__(
        self, spec: ModelSpec, *, dtype: jnp.dtype, kernels: str = "reference", tp: int = 1, ep: int = 1,
        rngs: nnx.Rngs,
    ):  # fmt: skip
        self.spec = layout = ShardLayout(spec, tp).global_spec  # every rank's heads, features and vocabulary rows
        self.embed_tokens = Embedding(
            layout.vocab_size, spec.hidden_size, dtype=dtype, tp=tp, pad_token_id=spec.pad_token_id, rngs=rngs
        )
        self.layers = nnx.List(
            [
                decoder_layer(layout, i, dtype=dtype, kernels=kernels, tp=tp, ep=ep, rngs=rngs)
                for i in range(spec.num_hidden_layers)
            ]
        )
        self.norm = make_norm(spec, spec.hidden_size, dtype=dtype, kernels=kernels)
        self.rotary_emb = RotaryEmbedding(spec)
        if SLIDING in spec.rope_kinds:  # sliding layers' own frequencies (Gemma 3's local base)
            self.rotary_emb_local = RotaryEmbedding(spec, SLIDING)

    def __call__(
        self,
        input_ids: jax.Array,
        positions: jax.Array,
        masks: Masks,
        cache: KVCache | None = None,
        last_only: bool = False,
        trace: dict[str, jax.Array] | None = None,
        routing: Routing | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """masks: `attention_masks(spec, ...)`, one per layer type; routing: teacher-forced expert ids per sparse
        layer (jax_impl/moe.py; validated by CausalLM)."""
        hidden = self.embed_tokens(input_ids)  # [B, T, H]
        if self.spec.embedding_scale:  # Gemma: sqrt(H) as float32, rounded to the activation dtype, then multiplied
            hidden = hidden * embedding_scale(self.spec, hidden.dtype)
        if trace is not None:
            trace["embed"] = hidden
        ropes = {FULL: self.rotary_emb(positions)}  # (cos, sin) per layer type with its own frequencies
        if SLIDING in self.spec.rope_kinds:
            ropes[SLIDING] = self.rotary_emb_local(positions)
        residual = None
        for i, layer in enumerate(self.layers):
            kind = self.spec.layer_type(i)
            cos, sin = ropes.get(kind, ropes[FULL])
            forced = {} if routing is None or i not in routing else {"routing": routing[i]}  # sparse layers only
            hidden, residual, cache = layer(hidden, residual, cos, sin, masks[kind], cache, trace, **forced)
        if last_only:  # the norm and head are per position: only the last one is needed
            hidden = hidden[:, -1:]  # [B, 1, H]
            residual = None if residual is None else residual[:, -1:]
        if residual is None:  # a plain-flow model (post-norm, parallel residual): hidden is x2 itself
            hidden = self.norm(hidden)
        else:
            hidden, _ = self.norm(hidden, residual)  # consumes the last increment: norm(x2 of the last layer)
        if trace is not None:
            trace["final_norm"] = hidden
        return hidden, cache


class CausalLM(nnx.Module):
    def __init__(
        self,
        spec: ModelSpec,
        *,
        dtype: jnp.dtype = jnp.float32,
        kernels: str = "reference",
        tp: int = 1,
        ep: int = 1,
        rngs: nnx.Rngs,
    ):
        """`spec` is the whole model's (ids and positions are checked against it); tp > 1 builds the
        tensor-parallel layout over a mesh's "model" axis (jax_impl/tensor_parallel.py), ep > 1 splits the
        experts over its "expert" axis (jax_impl/expert_parallel.py)."""
        self.spec = spec
        self.layout = ShardLayout(spec, tp)
        self.module_spec = self.layout.global_spec  # what the modules and the KV cache are sized by
        self.kernels = resolve_kernels(kernels, on_gpu=jax.default_backend() == "gpu")
        self.eos_token_ids: tuple[int, ...] = ()  # set by the loader from the checkpoint
        check_ep_degree(spec, ep)
        self.ep = ep
        self.model = Model(spec, dtype=dtype, kernels=self.kernels, tp=tp, ep=ep, rngs=rngs)
        if spec.tie_word_embeddings:
            self.lm_head = None  # tied: logits come from model.embed_tokens.attend, the one table
        else:
            self.lm_head = Linear(
                spec.hidden_size,
                self.module_spec.vocab_size,
                use_bias=False,
                dtype=dtype,
                param_dtype=dtype,
                precision=HIGHEST,
                rngs=rngs,
            )

    def logits(
        self,
        input_ids: jax.Array,
        positions: jax.Array,
        masks: Masks,
        cache: KVCache | None = None,
        last_only: bool = False,
        trace: dict[str, jax.Array] | None = None,
        routing: Routing | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """The traced body (call it under jit): validated ids -> (logits, updated cache)."""
        hidden, cache = self.model(input_ids, positions, masks, cache, last_only, trace, routing)
        if self.lm_head is None:
            logits = self.model.embed_tokens.attend(hidden)  # x @ E^T
        else:
            logits = self.lm_head(hidden)
        cap = self.spec.final_logit_softcapping
        if cap is not None:  # Gemma 2: cap * tanh(logits / cap) in float32, then the logits' dtype
            if trace is not None:
                trace["head"] = logits
            logits = final_softcap(logits, cap)
        if self.layout.padded_vocab != self.spec.vocab_size:  # padding rows of a sharded vocabulary: never chosen
            logits = mask_padding(logits, 0, self.spec.vocab_size)
        if trace is not None:
            trace["logits"] = logits
        return logits, cache

    def __call__(
        self,
        input_ids: jax.Array | np.ndarray | list,
        *,
        attention_mask: jax.Array | np.ndarray | None = None,
        positions: jax.Array | np.ndarray | None = None,
        last_only: bool = False,
        trace: dict[str, jax.Array] | None = None,
        routing: dict[int, jax.Array | np.ndarray] | None = None,
    ) -> jax.Array:
        """Token ids [B, T] -> logits [B, T, V] ([B, 1, V] with `last_only`). Uncached; see generate.py.

        attention_mask [B, T] marks real tokens (1) and padding (0); `trace`, a dict, receives the named
        intermediates (parity/), computed in the same compiled program. `routing` {sparse layer: ids [B, T, k]}
        makes those layers use the given experts (teacher forcing; jax_impl/moe.py), checked here on the host.
        """
        ids = check_token_ids(input_ids, self.spec)  # the checks both backends share (spec/inputs.py)
        b, t = ids.shape
        key_valid = np.ones((b, t), bool) if attention_mask is None else check_attention_mask(attention_mask, b, t)
        if positions is not None:
            positions = jnp.asarray(check_positions(positions, self.spec, b, t), jnp.int32)
        forced = check_routing(routing, self.spec, b, t)  # the checks in torch_impl's order, so either names one fault
        graphdef, state = nnx.split(self)
        # A sharded model runs under the mesh its parameters live on (its shard_maps need one: expert_parallel.py)
        mesh = self.model.embed_tokens.weight[...].sharding.mesh if self.layout.tp > 1 or self.ep > 1 else None
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
            logits, captured = forward(
                graphdef, state, jnp.asarray(ids, jnp.int32), key_valid, positions, forced,
                last_only=last_only, trace=trace is not None,
            )  # fmt: skip
        if trace is not None:
            trace.update(captured)
        return logits


@partial(jax.jit, static_argnames=("graphdef", "last_only", "trace"))
def forward(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    ids: jax.Array,
    key_valid: jax.Array,
    positions: jax.Array | None,
    routing: Routing | None = None,
    *,
    last_only: bool,
    trace: bool,
) -> tuple[jax.Array, dict[str, jax.Array] | None]:
    """The one jit-compiled entry point of the uncached forward."""
    model = nnx.merge(graphdef, state)
    t = ids.shape[1]
    if positions is None:
        positions = default_positions(key_valid, 0, t)
    captured: dict[str, jax.Array] | None = {} if trace else None
    masks = attention_masks(model.spec, key_valid, 0, t)
    logits, _ = model.logits(ids, positions, masks, None, last_only, captured, routing)
    return logits, captured
