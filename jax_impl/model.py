"""The decoder (`Model`) and the causal LM with its (tied) head (`CausalLM`). Only composes layers.

Mirrors torch_impl/model.py. `CausalLM.__call__` validates token ids at the boundary on the host, then
runs one jit-compiled entry point (`forward`) on the split graph and state. A tied model has no head
parameter: logits are `embed_tokens.attend(x)`, x @ E^T with the embedding Param itself. With tp > 1
(jax_impl/tensor_parallel.py) the modules are sized by `module_spec`, every rank's shards side by side, and
the loader places each device's slice.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_impl.decoder_layer import DecoderLayer
from jax_impl.embedding import HIGHEST, Embedding
from jax_impl.layernorm import RMSNorm
from jax_impl.linear import Linear
from jax_impl.rotary_embedding import RotaryEmbedding
from jax_impl.vocab_parallel import mask_padding
from kernels import resolve_kernels
from spec import ModelSpec, check_attention_mask, check_positions, check_token_ids
from spec.parallel import ShardLayout

if TYPE_CHECKING:
    from jax_impl.kv_cache import KVCache


def causal_mask(key_valid: jax.Array, q_start: jax.Array | int, q_len: int) -> jax.Array:
    """key_valid [B, S] bool; queries sit at slots q_start .. q_start + q_len - 1 -> mask [B, T, S]."""
    q_slot = q_start + jnp.arange(q_len)  # [T]
    k_slot = jnp.arange(key_valid.shape[1])  # [S]
    return (k_slot[None, :] <= q_slot[:, None])[None] & key_valid[:, None, :]  # [B, T, S]


def default_positions(key_valid: jax.Array, q_start: jax.Array | int, q_len: int) -> jax.Array:
    """Position of each query: its count of valid slots before it, so left padding does not shift RoPE."""
    positions = jnp.maximum(jnp.cumsum(key_valid.astype(jnp.int32), axis=-1) - 1, 0)  # [B, S]
    return jax.lax.dynamic_slice_in_dim(positions, q_start, q_len, axis=1)  # [B, T]


class Model(nnx.Module):
    def __init__(self, spec: ModelSpec, *, dtype: jnp.dtype, kernels: str = "reference", tp: int = 1, rngs: nnx.Rngs):
        self.spec = layout = ShardLayout(spec, tp).global_spec  # every rank's heads, features and vocabulary rows
        self.embed_tokens = Embedding(layout.vocab_size, spec.hidden_size, dtype=dtype, tp=tp, rngs=rngs)
        self.layers = nnx.List(
            [
                DecoderLayer(layout, i, dtype=dtype, kernels=kernels, tp=tp, rngs=rngs)
                for i in range(spec.num_hidden_layers)
            ]
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype=dtype, kernels=kernels)
        self.rotary_emb = RotaryEmbedding(spec)

    def __call__(
        self,
        input_ids: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        last_only: bool = False,
        trace: dict[str, jax.Array] | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        hidden = self.embed_tokens(input_ids)  # [B, T, H]
        if trace is not None:
            trace["embed"] = hidden
        cos, sin = self.rotary_emb(positions)
        residual = None
        for layer in self.layers:
            hidden, residual, cache = layer(hidden, residual, cos, sin, mask, cache, trace)
        if last_only:  # the norm and head are per position: only the last one is needed
            hidden, residual = hidden[:, -1:], residual[:, -1:]  # [B, 1, H]
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
        rngs: nnx.Rngs,
    ):
        """`spec` is the whole model's (ids and positions are checked against it); tp > 1 builds the
        tensor-parallel layout over a mesh's "model" axis (jax_impl/tensor_parallel.py)."""
        self.spec = spec
        self.layout = ShardLayout(spec, tp)
        self.module_spec = self.layout.global_spec  # what the modules and the KV cache are sized by
        self.kernels = resolve_kernels(kernels, on_gpu=jax.default_backend() == "gpu")
        self.eos_token_ids: tuple[int, ...] = ()  # set by the loader from the checkpoint
        self.model = Model(spec, dtype=dtype, kernels=self.kernels, tp=tp, rngs=rngs)
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
        mask: jax.Array,
        cache: KVCache | None = None,
        last_only: bool = False,
        trace: dict[str, jax.Array] | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """The traced body (call it under jit): validated ids -> (logits, updated cache)."""
        hidden, cache = self.model(input_ids, positions, mask, cache, last_only, trace)
        if self.lm_head is None:
            logits = self.model.embed_tokens.attend(hidden)  # x @ E^T
        else:
            logits = self.lm_head(hidden)
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
    ) -> jax.Array:
        """Token ids [B, T] -> logits [B, T, V] ([B, 1, V] with `last_only`). Uncached; see generate.py.

        attention_mask [B, T] marks real tokens (1) and padding (0); `trace`, a dict, receives the named
        intermediates (parity/), computed in the same compiled program.
        """
        ids = check_token_ids(input_ids, self.spec)  # the checks both backends share (spec/inputs.py)
        b, t = ids.shape
        key_valid = np.ones((b, t), bool) if attention_mask is None else check_attention_mask(attention_mask, b, t)
        graphdef, state = nnx.split(self)
        logits, captured = forward(
            graphdef,
            state,
            jnp.asarray(ids, jnp.int32),
            key_valid,
            None if positions is None else jnp.asarray(check_positions(positions, self.spec, b, t), jnp.int32),
            last_only=last_only,
            trace=trace is not None,
        )
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
    logits, _ = model.logits(ids, positions, causal_mask(key_valid, 0, t), None, last_only, captured)
    return logits, captured
