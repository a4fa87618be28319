"""Autoregressive generation with a KV cache: prefill, then one token per step; greedy or sampled.

Mirrors torch_impl/generate.py. Two jit-compiled functions with static shapes, built per model structure
by `compiled_steps`: `prefill` (the prompt, left-padded when rows differ in length, fills the cache and
yields the first token) and `decode_step` (one token per row in, the next token out). The cache buffer is
donated, so XLA updates it in place; the decode step compiles once per request shape, not once per step.
Rows that reached an EOS id keep emitting it until every row is done or `max_new_tokens` is reached.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Sequence
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.tree_util import PyTreeDef

from jax_impl import linear
from jax_impl.kv_cache import DONATE_CACHE, KVCache
from jax_impl.model import SLIDING, CausalLM, attention_masks, default_positions
from jax_impl.tensor_parallel import sharded_steps
from jax_impl.vocab_parallel import DATA, gather_logits, greedy_token
from kernels.cpu import jax_decode_layer, jax_decode_ops
from spec.generation import Generation, SamplingParams, check_request, collect_tokens


def sample(logits: jax.Array, params: SamplingParams, key: jax.Array) -> jax.Array:
    """logits [B, V] float32 -> token ids [B]: argmax, or temperature / top-k / top-p sampling."""
    if params.greedy:
        return jnp.argmax(logits, axis=-1)  # ties go to the lowest id
    # Shifted to a row maximum of 0 first: a small temperature then sends the others to -inf, never the maximum to inf.
    logits = (logits - logits.max(axis=-1, keepdims=True)) / params.temperature
    if params.top_k is not None:
        kth = jax.lax.top_k(logits, min(params.top_k, logits.shape[-1]))[0][:, -1:]  # [B, 1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if params.top_p is not None:
        order = jnp.argsort(-logits, axis=-1)  # [B, V], descending
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        drop = jnp.cumsum(probs, axis=-1) - probs > params.top_p  # keep the smallest prefix reaching top_p
        rows = jnp.arange(logits.shape[0])[:, None]
        logits = logits.at[rows, order].set(jnp.where(drop, -jnp.inf, sorted_logits))
    return jax.random.categorical(key, logits, axis=-1)


def _next(logits, params, key, finished, eos, tp):
    if params.greedy and tp > 1:  # vocabulary-sharded logits: reduce [B] values and ids, never gather [B, V]
        token = greedy_token(logits)
    else:
        token = sample(logits, params, key)
    if eos.shape[0]:
        token = jnp.where(finished, eos[0], token)
        finished = finished | jnp.isin(token, eos)
    return token, finished


def _prefill(graphdef, params: SamplingParams, state, cache: KVCache, ids, key_valid, key, eos):
    """Prompt ids [B, T] -> (first token [B], its logits [B, V] f32, cache, finished [B])."""
    model: CausalLM = nnx.merge(graphdef, state)
    t = ids.shape[1]
    masks = attention_masks(model.spec, key_valid, 0, t, cache)  # per layer type [B, T, S]
    # The cache starts empty: a full layer's slots past the prompt's T are unwritten, and attending over the T alone
    # skips their masked scores (jax_impl/attention.py takes the mask's width). A ring's slots stay as they are.
    masks = {kind: mask if kind == SLIDING else mask[..., :t] for kind, mask in masks.items()}  # [B, T, T]
    with jax_decode_ops.prompts():  # the prompt's rows: the CPU's attention in C where it applies
        logits, cache = model.logits(ids, default_positions(key_valid, 0, t), masks, cache, True)
    logits = logits[:, -1].astype(jnp.float32)  # [B, V]
    key = jax.random.fold_in(key, 0)
    token, finished = _next(logits, params, key, jnp.zeros(ids.shape[0], bool), eos, model.layout.tp)
    return token, logits, cache.advance(t), finished


def _decode_step(graphdef, params: SamplingParams, state, cache: KVCache, token, key_valid, finished, key, eos):
    """One token per row [B] in -> (next token [B], its logits [B, V] f32, cache, key_valid, finished)."""
    model: CausalLM = nnx.merge(graphdef, state)
    key_valid = key_valid.at[:, cache.length].set(True)  # [B, S_max]: this step's slot is a real token
    positions = default_positions(key_valid, cache.length, 1)  # [B, 1]
    masks = attention_masks(model.spec, key_valid, cache.length, 1, cache)  # per layer type [B, 1, S]
    with jax_decode_ops.decode_steps():  # one token per row: the CPU's attention over the cache in C where it applies
        logits, cache = model.logits(token[:, None], positions, masks, cache, True)
    logits = logits[:, -1].astype(jnp.float32)
    key = jax.random.fold_in(key, cache.length)  # this step's randomness: the prompt's step folded in 0
    token, finished = _next(logits, params, key, finished, eos, model.layout.tp)
    return token, logits, cache.advance(1), key_valid, finished


def _kernels() -> tuple[bool, bool]:
    """The CPU decode kernels allowed here, part of a compiled step's key: a step traced under
    jax_decode_ops.reference_only() keeps the reference, one under jax_decode_layer.per_operator() its per-operator
    layers, so each setting has its own pair of functions (and its own compilations)."""
    return jax_decode_ops.enabled(), jax_decode_layer.enabled()


# Per model: (its pytree structure, graph definition, the state's tree structure, where each state leaf sits among
# the model's pytree leaves), so that a later call on an unchanged model skips nnx.split.
_SPLITS: weakref.WeakKeyDictionary[CausalLM, tuple[PyTreeDef, nnx.GraphDef, PyTreeDef, list[int]]] = (
    weakref.WeakKeyDictionary()
)


def split_model(model: CausalLM) -> tuple[nnx.GraphDef, list[jax.Array], PyTreeDef]:
    """nnx.split(model) as (graph definition, the state's flat leaves, their tree structure).

    nnx.split walks the module graph in Python, which generate would pay on every call, inside the time to the first
    token; flattening the model as a pytree is an order of magnitude cheaper (docs/benchmarks.md). So the split is
    kept per model with the model's pytree structure and the state leaves' places among its leaves, and reused while
    that structure is unchanged: a new array in a parameter (a training step, a reload) is read where it now sits,
    and a changed structure (a layer replaced, a kernels setting changed) splits afresh."""
    leaves, structure = jax.tree.flatten(model)
    known = _SPLITS.get(model)
    if known is not None and known[0] == structure:
        _, graphdef, treedef, places = known
        return graphdef, [leaves[i] for i in places], treedef
    graphdef, state = nnx.split(model)
    state_leaves, treedef = jax.tree.flatten(state)
    place = {id(leaf): i for i, leaf in enumerate(leaves)}
    # kept only where every state leaf is one pytree leaf of its own: an array held twice (a Variable shared by two
    # modules, or one array in two Variables) would be read from one place after the other changed
    if len(place) == len(leaves) and all(id(leaf) in place for leaf in state_leaves):
        _SPLITS[model] = (structure, graphdef, treedef, [place[id(leaf)] for leaf in state_leaves])
    return graphdef, state_leaves, treedef


def step_functions(graphdef: nnx.GraphDef, treedef: PyTreeDef, params: SamplingParams) -> tuple[Callable, Callable]:
    """`_step_functions` for the kernels allowed here (`_kernels`)."""
    return _step_functions(graphdef, treedef, params, _kernels())


@lru_cache(maxsize=16)
def _step_functions(
    graphdef: nnx.GraphDef, treedef: PyTreeDef, params: SamplingParams, kernels: tuple[bool, bool]
) -> tuple[Callable, Callable]:
    """(prefill, decode_step) for one model structure and sampling setup, taking the state as its flat leaves.

    The graph definition, the state's tree structure and the sampling parameters are bound here rather than
    passed to jit as static arguments: jit hashes static arguments and flattens an nnx.State on every call,
    which costs milliseconds per decode step (docs/benchmarks.md); a flat list of arrays is cheap. Cached, so
    that one structure always gives the same pair of functions, and the compiled steps keyed on them are reused.
    """

    def prefill(leaves: list[jax.Array], cache: KVCache, ids, key_valid, key, eos):
        state = jax.tree.unflatten(treedef, leaves)
        with contextlib.nullcontext() if kernels[0] else jax_decode_ops.reference_only():  # as when it was keyed
            return _prefill(graphdef, params, state, cache, ids, key_valid, key, eos)

    def decode_step(leaves: list[jax.Array], cache: KVCache, token, key_valid, finished, key, eos):
        state = jax.tree.unflatten(treedef, leaves)
        ops, layers = kernels  # as when it was keyed
        with (
            contextlib.nullcontext() if ops else jax_decode_ops.reference_only(),
            contextlib.nullcontext() if layers else jax_decode_layer.per_operator(),
        ):
            return _decode_step(graphdef, params, state, cache, token, key_valid, finished, key, eos)

    return prefill, decode_step


# compiled_steps' results by the graph definition's identity: hashing an nnx GraphDef walks it (inside the time to
# the first token; docs/benchmarks.md), and split_model hands back the same object for an unchanged model. Each entry
# holds its graph definition, so its id is not reused while the entry stands.
_BY_IDENTITY: dict[tuple, tuple[nnx.GraphDef, tuple[Callable, Callable]]] = {}


def compiled_steps(graphdef: nnx.GraphDef, treedef: PyTreeDef, params: SamplingParams) -> tuple[Callable, Callable]:
    """The jit-compiled (prefill, decode_step): one per model structure, sampling setup and `step_functions`'
    kernel setting, each compiling once per request shape (batch, prompt length, cache length)."""
    key = (id(graphdef), treedef, params, _kernels())
    known = _BY_IDENTITY.get(key)
    if known is not None and known[0] is graphdef:
        return known[1]
    steps = _compiled_steps(graphdef, treedef, params, key[3])
    if len(_BY_IDENTITY) >= 16:  # as many as _compiled_steps keeps
        _BY_IDENTITY.clear()
    _BY_IDENTITY[key] = (graphdef, steps)
    return steps


@lru_cache(maxsize=16)
def _compiled_steps(
    graphdef: nnx.GraphDef, treedef: PyTreeDef, params: SamplingParams, kernels: tuple[bool, bool]
) -> tuple[Callable, Callable]:
    prefill, decode_step = _step_functions(graphdef, treedef, params, kernels)
    return jax.jit(prefill, **DONATE_CACHE), jax.jit(decode_step, **DONATE_CACHE)


def generate(
    model: CausalLM,
    input_ids: np.ndarray | jax.Array | Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    attention_mask: np.ndarray | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_ids: int | Sequence[int] | None = None,
    stream: Callable[[int, np.ndarray], None] | None = None,
    return_logits: bool = False,
    mesh: Mesh | None = None,
) -> Generation:
    """Generate up to `max_new_tokens` per row. `eos_token_ids` None = the checkpoint's; () = never stop; else an
    id or a sequence of ids in [0, V).

    `stream(step, tokens[B])` is called as each token is produced, while the next step already runs (JAX dispatches
    it first, so the host's work of a step overlaps the device's; where every row has ended, that one step is
    computed and dropped). With the `mesh` a sharded model was loaded on, the steps run with explicit shardings and
    greedy decoding never gathers the vocabulary.
    """
    request = check_request(  # any framework's arrays: spec/inputs.py reads them on the host
        model.spec, input_ids, max_new_tokens, attention_mask, eos_token_ids, model.eos_token_ids,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
    )  # fmt: skip
    params, prompts, eos = request.params, request.prompts, jnp.asarray(request.eos, jnp.int32)
    batch, prompt_len = prompts.ids.shape
    dtype = model.model.embed_tokens.weight[...].dtype
    slots = prompt_len + max_new_tokens - 1  # the last new token is never fed back
    cache = KVCache.create(model.module_spec, batch, slots, dtype)
    key_valid = np.zeros((batch, slots), bool)  # [B, S_max]
    key_valid[:, :prompt_len] = prompts.mask.astype(bool)
    # One key for the whole generation: each compiled step folds in its cache length, so steps draw afresh without
    # the host slicing a per-step key (a dispatch of its own each step, on the cores the step computes on).
    key = jax.random.key(params.seed)
    graphdef, leaves, treedef = split_model(model)
    steps, logits_seen = [], []
    if mesh is None:
        prefill_fn, decode_fn = compiled_steps(graphdef, treedef, params)
    else:
        steps_fns = step_functions(graphdef, treedef, params)
        prefill_fn, decode_fn, cache = sharded_steps(mesh, steps_fns, leaves, cache)
    # A product's first trace may time its forms: over this model's own weights, in memory already (jax_impl/linear.py).
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext(), linear.resident_weights(leaves):
        start = time.perf_counter()
        token, logits, cache, finished = prefill_fn(
            leaves, cache, prompts.ids.astype(np.int32), key_valid, key, eos
        )  # host arrays: jit places them (under a mesh, by its in_shardings)
        # The same placement every decode step returns, so the step compiles exactly once; unsharded, the device
        # the prompt ran on (the model's: under jax.default_device it need not be jax.devices()[0], and a mask
        # committed there would move every decode step, parameters and cache, to that device).
        rows = NamedSharding(mesh, P(DATA, None)) if mesh is not None else token.sharding
        key_valid = jax.device_put(key_valid, rows)
        token.block_until_ready()
        prefill_done = time.perf_counter()
        for step in range(max_new_tokens):
            # The next step is dispatched before this one's token is read on the host: JAX runs it while the host
            # copies the token, streams it and checks for the end (an early end leaves one step computed unread).
            last = step == max_new_tokens - 1
            if not last:
                following = decode_fn(leaves, cache, token, key_valid, finished, key, eos)
                cache, key_valid = following[2], following[3]
            steps.append(np.asarray(token))
            if return_logits:  # the explicit request for whole logits
                whole = logits if mesh is None else gather_logits(logits, model.spec.vocab_size)
                logits_seen.append(np.asarray(whole)[:, : model.spec.vocab_size])
            if stream is not None:
                stream(step, steps[-1])
            if last or np.asarray(finished).all():  # [B] on the host: no device reduction
                break
            token, logits, _, _, finished = following
        end = time.perf_counter()
    cache.check()  # a write past the cache's capacity is refused here, before any token is returned
    eos_ids = tuple(int(e) for e in np.asarray(eos))
    logits_seen = logits_seen if return_logits else None
    return Generation(collect_tokens(steps, eos_ids), prefill_done - start, end - prefill_done, logits_seen)
