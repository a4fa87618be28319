"""jax_impl's decoder one piece at a time, straight from a checkpoint: for a layer-streamed parity check.

Mirrors torch_impl/layerwise.py. `Layerwise` builds each piece from the classes the whole model is made of
(`Embedding`, `decoder_layer`, `make_norm`, `Linear`) abstractly (`nnx.eval_shape`), fills it from
spec/layerwise.py (`runtime_params` restricted to the piece: validated, packed, scanned) as
jax_impl/loader.py fills the whole model (Linear kernels transposed to Flax's [in, out]), runs it and drops
it before the next piece loads:

    embed(ids)             the embedding: a gather from the rows the ids read (rows[inverse] == E[ids])
    run_layer(i, inputs)   decoder layer i, loaded once, run on each input (free-running, teacher-forced)
    head(inputs)           the final norm, then the logits over the head's table in blocks of rows

One compiled program per piece structure, reused: every decoder layer is built as layer 0 (the index only
names trace entries, renamed after the run), so all layers share one graph and one compilation per layer type
(its window and RoPE; one more where layer 0's input has no residual yet); the head's blocks share one (two: the
last block is shorter). Between pieces only the activations at a layer boundary are kept: a `Boundary`, the
(hidden, residual) pair of the dual-variable flow (docs/design.md, "The dual-variable flow"), or (x, None) between
plain-flow layers (post-norm, parallel residual: jax_impl/decoder_layer_plain.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_impl.decoder_layer import decoder_layer
from jax_impl.embedding import HIGHEST, Embedding
from jax_impl.layernorm import make_norm
from jax_impl.linear import Linear
from jax_impl.loader import _FLAX_ATTR, DTYPES
from jax_impl.model import causal_mask, default_positions, embedding_scale, final_softcap
from jax_impl.moe import check_routing
from jax_impl.rotary_embedding import RotaryEmbedding
from kernels import resolve_kernels
from spec import Checkpoint, ModelSpec, check_token_ids, dtype_name, runtime_params
from spec.families import FULL, SLIDING
from spec.layerwise import check_layer_call, embedding_rows, final_norm_module, head_blocks, layer_params
from spec.params import EMBEDDING, LINEAR

Boundary = tuple[jax.Array, jax.Array | None]  # (hidden, residual); residual None before layer 0
Trace = dict[str, jax.Array] | None
_BUILT_AS = "layers.0."  # every layer is built as layer 0: its trace names are renamed to the real index


@partial(jax.jit, static_argnames=("graphdef", "spec", "layer_type"))
def _layer_program(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    hidden: jax.Array,
    residual: jax.Array | None,
    spec: ModelSpec,
    layer_type: str,
    routing: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None, dict[str, jax.Array]]:
    """One decoder layer with the RoPE angles and mask `CausalLM.__call__` builds for unpadded ids and a layer of
    `layer_type` (its window, its RoPE frequencies): one program per layer type, not per layer."""
    layer = nnx.merge(graphdef, state)
    b, t = hidden.shape[:2]
    key_valid = jnp.ones((b, t), bool)
    rope = layer_type if layer_type in spec.rope_kinds else FULL
    cos, sin = RotaryEmbedding(spec, rope)(default_positions(key_valid, 0, t))
    mask = causal_mask(key_valid, 0, t, spec.sliding_window if layer_type == SLIDING else None)
    trace: dict[str, jax.Array] = {}
    forced = {} if routing is None else {"routing": routing}  # a sparse layer's teacher-forced ids [B, T, k]
    hidden, residual, _ = layer(hidden, residual, cos, sin, mask, None, trace, **forced)
    return hidden, residual, trace


@partial(jax.jit, static_argnames=("graphdef", "spec"))
def _embed_program(graphdef: nnx.GraphDef, state: nnx.State, inverse: jax.Array, spec: ModelSpec) -> jax.Array:
    hidden = nnx.merge(graphdef, state)(inverse)  # [B, T, H]
    if spec.embedding_scale:  # Gemma, as jax_impl/model.py
        hidden = hidden * embedding_scale(spec, hidden.dtype)
    return hidden


@partial(jax.jit, static_argnames=("graphdef",))
def _norm_program(graphdef: nnx.GraphDef, state: nnx.State, hidden: jax.Array, residual: jax.Array | None) -> jax.Array:
    norm = nnx.merge(graphdef, state)
    return norm(hidden) if residual is None else norm(hidden, residual)[0]  # consumes the last increment


@partial(jax.jit, static_argnames=("graphdef",))
def _head_program(graphdef: nnx.GraphDef, state: nnx.State, x: jax.Array) -> jax.Array:
    head = nnx.merge(graphdef, state)
    return head.attend(x) if isinstance(head, Embedding) else head(x)  # tied: x @ E^T, as CausalLM.logits


_softcap_program = jax.jit(final_softcap, static_argnames=("cap",))  # as CausalLM.logits, after the whole head


def _place(array: np.ndarray, dtype: jnp.dtype, transpose: bool) -> jax.Array:
    """A checkpoint array on the device in `dtype`, a Linear weight transposed ([out, in] -> Flax [in, out]).

    In the checkpoint's dtype numpy transposes on the host, as jax_impl/loader.py does; a cast (bf16 to the
    float32 baseline) runs on the device instead, so the host never holds a float32 copy beside the device's."""
    if array.dtype == dtype:
        return jnp.asarray(np.swapaxes(array, -1, -2) if transpose else array)  # stacked experts: [E, in, out]
    return _cast_program(jnp.asarray(array), dtype, transpose)


@partial(jax.jit, static_argnames=("dtype", "transpose"))
def _cast_program(x: jax.Array, dtype: jnp.dtype, transpose: bool) -> jax.Array:
    return (jnp.swapaxes(x, -1, -2) if transpose else x).astype(dtype)


class Layerwise:
    """One checkpoint, one dtype: its pieces built and run on demand; `load_s` and `run_s` add up the time."""

    def __init__(self, path: str | Path, dtype: jnp.dtype | str = "float32", *, kernels: str = "reference"):
        self.directory = Path(path)
        self.spec = ModelSpec.from_pretrained(path)
        self.dtype = DTYPES[dtype_name(dtype)]
        self.kernels = resolve_kernels(kernels, on_gpu=jax.default_backend() == "gpu")
        self._embedded = False
        self._structures: dict[tuple, tuple[nnx.GraphDef, nnx.State]] = {}  # abstract (graph, state) per piece
        self.load_s = self.run_s = 0.0

    def _build(
        self, key: tuple, make: Callable[[], nnx.Module], params: Iterable[tuple[str, str, str, np.ndarray]]
    ) -> tuple[nnx.GraphDef, nnx.State]:
        """The piece `make()` builds, as (graph, state), its parameters from `params` (module path inside the
        piece, role, kind, array) placed as jax_impl/loader.py places them (Linear kernels transposed).

        The graph comes from an abstract module (`nnx.eval_shape`), built once per structure `key` and reused,
        so every layer has the same graph and jit compiles one program for all. The arrays go straight into a
        state and never into a module: Flax modules hold reference cycles, so arrays set on one stay alive
        until Python's cyclic collector runs, a layer's weights per layer streamed."""
        start = time.perf_counter()
        if key not in self._structures:
            self._structures[key] = nnx.split(nnx.eval_shape(make))
        graphdef, abstract = self._structures[key]
        flat = {tuple(str(k) for k in path): variable for path, variable in nnx.to_flat_state(abstract)}
        filled = {}
        for path, role, kind, array in params:
            where = (*[p for p in path.split(".") if p], _FLAX_ATTR.get((kind, role), role))
            value = _place(array, self.dtype, kind == LINEAR)
            if value.shape != flat[where].get_value().shape:
                raise AssertionError(
                    f"{path}.{role}: packed shape {list(value.shape)} != {flat[where].get_value().shape}"
                )
            filled[where] = flat[where].replace(value)
        if filled.keys() != flat.keys():
            raise AssertionError(f"parameters the checkpoint did not fill: {sorted(flat.keys() - filled.keys())}")
        self.load_s += time.perf_counter() - start
        return graphdef, nnx.from_flat_state(list(filled.items()))

    def _run(self, program: Callable, *args) -> object:
        start = time.perf_counter()
        out = jax.block_until_ready(program(*args))
        self.run_s += time.perf_counter() - start
        return out

    def embed(self, ids: np.ndarray, trace: Trace = None) -> Boundary:
        """The embedding of `ids` [B, T] (checked against the vocabulary first: jnp.take would clamp)."""
        ids = check_token_ids(ids, self.spec)
        rows, inverse = embedding_rows(self.directory, self.spec, ids)  # rows [U, H], inverse [B, T]
        size = (rows.shape[0], self.spec.hidden_size)
        graphdef, state = self._build(
            ("embed", *size),
            lambda: Embedding(*size, dtype=self.dtype, rngs=nnx.Rngs(0)),
            [("", "weight", EMBEDDING, rows)],
        )
        inverse = jnp.asarray(inverse, jnp.int32)
        hidden = self._run(_embed_program, graphdef, state, inverse, self.spec)  # [B, T, H]
        self._embedded = True
        if trace is not None:
            trace["embed"] = hidden
        return hidden, None

    def boundary(self, x: np.ndarray, *, first_layer: bool) -> Boundary:
        """Another run's x at a layer boundary (float32 numpy of values in this dtype, so the cast is exact) as
        this backend's layer input: (x, None) before layer 0 (x is the embedding); else (0, x), whose
        add_rms_norm gives exactly x as the new residual, so the layer normalizes exactly x."""
        array = jnp.asarray(np.asarray(x, dtype=np.float32), dtype=self.dtype)
        plain = self.spec.parallel_residual or not self.spec.pre_norm  # plain-flow layers take (x, None)
        return (array, None) if first_layer or plain else (jnp.zeros_like(array), array)

    def run_layer(
        self, index: int, inputs: Sequence[Boundary], traces: Sequence[Trace],
        routing: Sequence[np.ndarray | None] | None = None,
    ) -> list[Boundary]:  # fmt: skip
        """Load decoder layer `index`, run it on each input (recording into the matching trace), drop it.

        `routing`: per input, this (sparse) layer's teacher-forced expert ids [B, T, k] or None (jax_impl/moe.py;
        checked as CausalLM checks them)."""
        forced = check_layer_call(self._embedded, routing, len(inputs))
        sparse = self.spec.is_sparse(index)  # built as layer 0 with layer index's MLP: a dense or a sparse block
        as_layer0 = self.spec
        if self.spec.num_experts:
            as_layer0 = dataclasses.replace(self.spec, decoder_sparse_step=1, mlp_only_layers=() if sparse else (0,))
        graphdef, state = self._build(
            ("layer", sparse),
            lambda: decoder_layer(as_layer0, 0, dtype=self.dtype, kernels=self.kernels, rngs=nnx.Rngs(0)),
            layer_params(self.directory, self.spec, index),
        )
        outputs = []
        kind = self.spec.layer_type(index)
        for (hidden, residual), trace, ids in zip(inputs, traces, forced, strict=True):
            if ids is not None:
                ids = check_routing({index: ids}, self.spec, *hidden.shape[:2])[index]
            program = partial(_layer_program, routing=ids)
            hidden, residual, captured = self._run(program, graphdef, state, hidden, residual, self.spec, kind)
            if trace is not None:
                name = f"layers.{index}."
                trace.update({name + key.removeprefix(_BUILT_AS): value for key, value in captured.items()})
            outputs.append((hidden, residual))
        return outputs

    def head(self, inputs: Sequence[Boundary], traces: Sequence[Trace]) -> list[jax.Array]:
        """The final norm of each input (consuming the last increment), then its logits [B, T, V], the head's
        table read in blocks of rows (spec/layerwise.py); returns the logits."""
        h, module = self.spec.hidden_size, final_norm_module(self.spec)
        # The final norm's parameters (RMSNorm: a weight; LayerNorm: weight and bias), copied out of the map.
        params = [
            ("", role, kind, np.array(array))
            for _, role, kind, array in runtime_params(
                Checkpoint(self.directory), self.spec, modules=lambda m: m == module
            )
        ]
        norm = self._build(("norm",), lambda: make_norm(self.spec, h, dtype=self.dtype, kernels=self.kernels), params)
        normed = [self._run(_norm_program, *norm, hidden, residual) for hidden, residual in inputs]  # [B, T, H]
        blocks: list[list[jax.Array]] = [[] for _ in inputs]
        for _start, kind, block in head_blocks(self.directory, self.spec):
            n = block.shape[0]  # a block of the [V, H] table: n logits

            def make(n: int = n, kind: str = kind) -> nnx.Module:
                if kind == EMBEDDING:  # tied: the embedding's own attend, x @ E^T
                    return Embedding(n, h, dtype=self.dtype, rngs=nnx.Rngs(0))
                kw = dict(use_bias=False, dtype=self.dtype, param_dtype=self.dtype, precision=HIGHEST)
                return Linear(h, n, **kw, rngs=nnx.Rngs(0))

            head = self._build(("head", kind, n), make, [("", "weight", kind, block)])
            for out, x in zip(blocks, normed, strict=True):
                out.append(self._run(_head_program, *head, x))  # [B, T, n]
            del head, block  # before the next block loads
        heads = [jnp.concatenate(out, axis=-1) for out in blocks]  # [B, T, V]
        cap = self.spec.final_logit_softcapping
        logits = heads if cap is None else [self._run(_softcap_program, x, cap) for x in heads]
        for trace, final, head, full in zip(traces, normed, heads, logits, strict=True):
            if trace is not None:
                trace["final_norm"] = final
                if cap is not None:
                    trace["head"] = head
                trace["logits"] = full
        return logits
