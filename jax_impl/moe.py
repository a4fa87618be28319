"""A mixture-of-experts layer's MLP (`SparseMoeBlock`): a router, top-k routing, stacked experts, and (Qwen2-MoE)
a shared expert behind a sigmoid gate. Mirrors torch_impl/moe.py; the math is transformers'
(docs/design.md, "Mixture of experts"):

    router_logits = x @ Wr^T                          activation dtype, as transformers' F.linear
    probs = softmax(float32(router_logits))           top-k over probs: ties go to the lower expert index
    weights = top-k probs (/ their sum if norm_topk_prob), in float32 (Mixtral) or rounded to the activation dtype
    experts_out[n] = sum_j round(weights[n, j] * expert_{ids[n, j]}(x_n))
                                        (transformers adds the k products one by one in expert order, each add
                                        rounded; here the sum over k is one reduction: the same for k = 2, within
                                        an ulp of the activation dtype for k > 2)

The experts are one parameter per projection, `StackedLinear.kernel` [E, in, out] (Flax layout: the loader swaps
the checkpoint's [E, out, in]). The jitted path has no Python loop over experts: `DISPATCH` names four forms
(dense one-hot, sorted ragged_dot, sorted tiles of one expert each, per-token gathered weights) and
`PHASE_DISPATCH` the one each phase takes, chosen by measurement on CPU (figures beside it). Under expert
parallelism (jax_impl/expert_parallel.py) the experts run per shard of the [E] axis.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl.activation import GATED
from jax_impl.linear import Linear
from jax_impl.mlp import MLP
from spec import ModelSpec
from spec.inputs import check_routing as spec_check_routing

HIGHEST = jax.lax.Precision.HIGHEST


class StackedLinear(nnx.Module):
    """E bias-free linear maps stacked on a leading axis: `kernel` [E, in, out] (no product of its own: the
    dispatch forms below read it)."""

    def __init__(self, num: int, in_features: int, out_features: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        self.kernel = nnx.Param(init(rngs.params(), (num, in_features, out_features), dtype))


def gated(act: nnx.Module, gate_up: jax.Array, tp: int) -> jax.Array:
    """[..., 2I] -> [..., I]; with tp > 1 the gate and up halves are grouped per shard (spec/parallel.py)."""
    if tp == 1:
        return act(gate_up)
    lead = gate_up.shape[:-1]
    return act(gate_up.reshape(*lead, tp, -1)).reshape(*lead, -1)  # [..., s, 2I/s] -> [..., I]


def dispatch_dense(x, ids, w_gu, w_down, act) -> jax.Array:
    """Every token through every expert (reads all weights), then each token's k outputs picked: [N, k, H]."""
    h = jnp.einsum("nh,ehf->nef", x, w_gu, precision=HIGHEST)  # [N, E, 2I]
    y = jnp.einsum("nei,eih->neh", act(h), w_down, precision=HIGHEST)  # [N, E, H]
    return jnp.take_along_axis(y, ids[..., None], axis=1)  # [N, k, H]


def dispatch_ragged(x, ids, w_gu, w_down, act) -> jax.Array:
    """The N*k (token, expert) pairs sorted by expert, one grouped product per projection: [N, k, H]."""
    n, k = ids.shape
    flat = ids.reshape(-1)  # [N*k]
    order = jnp.argsort(flat, stable=True)  # [N*k]: pairs grouped by expert
    sizes = jnp.bincount(flat, length=w_gu.shape[0]).astype(jnp.int32)  # [E] rows per expert
    rows = x[order // k]  # [N*k, H]
    h = jax.lax.ragged_dot(rows, w_gu, sizes, precision=HIGHEST)  # [N*k, 2I]
    y = jax.lax.ragged_dot(act(h), w_down, sizes, precision=HIGHEST)  # [N*k, H]
    return jnp.zeros_like(y).at[order].set(y).reshape(n, k, -1)  # back in (token, slot) order: [N, k, H]


def dispatch_tiled(x, ids, w_gu, w_down, act, tile: int = 16) -> jax.Array:
    """The pairs sorted by expert into tiles of `tile` rows, each tile one expert's (its group padded to a multiple
    of `tile`); each tile's expert weights gathered, one batched product: [N, k, H]. At most N*k/tile + E tiles."""
    n, k = ids.shape
    e = w_gu.shape[0]
    flat = ids.reshape(-1)  # [N*k]
    order = jnp.argsort(flat, stable=True)  # [N*k]
    expert = flat[order]  # [N*k], ascending
    sizes = jnp.bincount(flat, length=e)  # [E]
    padded = -(-sizes // tile) * tile  # [E]: each group rounded up to whole tiles
    start, pstart = jnp.cumsum(sizes) - sizes, jnp.cumsum(padded) - padded  # [E] exclusive prefix sums
    dest = pstart[expert] + jnp.arange(n * k) - start[expert]  # [N*k]: row in the padded layout
    tiles = -(-n * k // tile) + e
    rows = jnp.zeros((tiles * tile, x.shape[1]), x.dtype).at[dest].set(x[order // k])  # [tiles*tile, H]
    ends = jnp.cumsum(padded)  # [E]: where each expert's tiles end; a tile belongs to the first expert ending after it
    owner = (ends[None, :] <= (jnp.arange(tiles) * tile)[:, None]).sum(axis=1)  # [tiles] (searchsorted, right)
    owner = jnp.minimum(owner, e - 1)  # unused tiles (zero rows) read the last expert
    rows = rows.reshape(tiles, tile, -1)  # [tiles, tile, H]
    h = jnp.einsum("tmh,thf->tmf", rows, w_gu[owner], precision=HIGHEST)  # [tiles, tile, 2I]
    y = jnp.einsum("tmi,tih->tmh", act(h), w_down[owner], precision=HIGHEST).reshape(tiles * tile, -1)
    out = jnp.zeros((n * k, y.shape[-1]), y.dtype).at[order].set(y[dest])  # [N*k, H] in (token, slot) order
    return out.reshape(n, k, -1)


def dispatch_gather(x, ids, w_gu, w_down, act) -> jax.Array:
    """Each token's k experts' weights gathered ([N, k, H, 2I]; reads only the selected ones): [N, k, H]."""
    h = jnp.einsum("nh,nkhf->nkf", x, w_gu[ids], precision=HIGHEST)  # [N, k, 2I]
    return jnp.einsum("nki,nkih->nkh", act(h), w_down[ids], precision=HIGHEST)  # [N, k, H]


DISPATCH = {"dense": dispatch_dense, "ragged": dispatch_ragged, "tiled": dispatch_tiled, "gather": dispatch_gather}
# Measured on this CPU (2 shared cores, Qwen3-MoE benchmark shape H 384, E 32, k 2, Im 192; ms per layer, float32,
# medians of 15 interleaved passes over 8 layers' weights): decode N=1 dense 15.1, ragged 26.6, tiled 28.6, gather
# 3.0; N=8 30.9 / 35.2 / 26.5 / 20.0; prefill N=128 48.5 / 98.3 / 38.9 / 421.5 (bfloat16 alike). XLA:CPU's
# ragged_dot is slower than the dense form here; gather reads only the selected experts (decode), tiles compute
# only the routed rows (prefill). Up to GATHER_MAX_ROWS token rows gather, more tiled.
PHASE_DISPATCH = {"decode": "gather", "prefill": "tiled"}
GATHER_MAX_ROWS = 8


def choose_dispatch(rows: int) -> str:
    return PHASE_DISPATCH["decode" if rows <= GATHER_MAX_ROWS else "prefill"]


def route(logits: jax.Array, k: int, norm: bool, keep_f32: bool, forced: jax.Array | None = None):
    """router logits [N, E] -> (ids [N, k] int32, weights [N, k]): top-k of the float32 softmax, or the
    probabilities at `forced` ids (teacher forcing), renormalized and cast as the family does."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)  # [N, E]
    if forced is None:
        weights, ids = jax.lax.top_k(probs, k)  # descending; equal values: lower index first
    else:
        ids = forced
        weights = jnp.take_along_axis(probs, ids, axis=-1)  # [N, k]
    if norm:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    if not keep_f32:
        weights = weights.astype(logits.dtype)
    return ids.astype(jnp.int32), weights


def check_routing(routing: dict | None, spec: ModelSpec, b: int, t: int) -> dict[int, jax.Array] | None:
    """Teacher-forced ids {sparse layer: [B, T, k] ints in [0, E), distinct per token} -> int32 device arrays.
    Checked on the host by the twins' shared rules (spec.inputs.check_routing): under jit an out-of-range id
    would be clamped by the gather, silently."""
    checked = spec_check_routing(routing, spec, b, t)
    return None if checked is None else {layer: jnp.asarray(ids, jnp.int32) for layer, ids in checked.items()}


class Experts(nnx.Module):
    """The stacked experts: gate_up_proj [E, H, 2I] (gate first, per tp shard), down_proj [E, I, H]."""

    def __init__(self, spec: ModelSpec, *, dtype: jnp.dtype, kernels: str, tp: int, ep: int, rngs: nnx.Rngs):
        e, h, i = spec.num_experts, spec.hidden_size, spec.moe_intermediate_size
        self.tp = tp
        self.ep = ep  # > 1: the [E] axis is split over the mesh's "expert" axis (jax_impl/expert_parallel.py)
        self.gate_up_proj = StackedLinear(e, h, 2 * i, dtype=dtype, rngs=rngs)
        self.down_proj = StackedLinear(e, i, h, dtype=dtype, rngs=rngs)
        self.act_fn = GATED[spec.hidden_act](kernels=kernels)

    def __call__(self, x: jax.Array, ids: jax.Array, dispatch: str | None = None) -> jax.Array:
        """x [N, H], ids [N, k] (global expert ids, in range) -> each slot's expert output [N, k, H]."""
        form = DISPATCH[dispatch or choose_dispatch(x.shape[0])]
        w_gu, w_down = self.gate_up_proj.kernel[...], self.down_proj.kernel[...]

        def act(h):
            return gated(self.act_fn, h, self.tp)

        if self.ep > 1:
            from jax_impl.expert_parallel import sharded_experts  # no cycle: it imports this file's forms

            return sharded_experts(form, x, ids, w_gu, w_down, act)
        return form(x, ids, w_gu, w_down, act)


class SparseMoeBlock(nnx.Module):
    def __init__(
        self, spec: ModelSpec, layer_idx: int, *, dtype: jnp.dtype, kernels: str = "reference", tp: int = 1,
        ep: int = 1, rngs: nnx.Rngs,
    ):  # fmt: skip
        self.layer_idx = layer_idx
        self.num_experts, self.top_k = spec.num_experts, spec.num_experts_per_tok
        self.norm_topk_prob = spec.norm_topk_prob
        self.router_weights_float32 = spec.router_weights_float32
        self.dispatch: str | None = None  # None: by phase (PHASE_DISPATCH); a DISPATCH name pins one (tests)
        kw = dict(use_bias=False, dtype=dtype, param_dtype=dtype, precision=HIGHEST, rngs=rngs)
        self.router = Linear(spec.hidden_size, spec.num_experts, **kw)
        self.experts = Experts(spec, dtype=dtype, kernels=kernels, tp=tp, ep=ep, rngs=rngs)
        if spec.shared_expert_intermediate_size:  # Qwen2-MoE: a dense SwiGLU of its own width, gated
            shared = dataclasses.replace(spec, intermediate_size=spec.shared_expert_intermediate_size)
            self.shared_expert = MLP(shared, layer_idx, dtype=dtype, kernels=kernels, tp=tp, rngs=rngs)
            self.shared_expert_gate = Linear(spec.hidden_size, 1, **kw)
        else:
            self.shared_expert = self.shared_expert_gate = None

    def __call__(
        self, x: jax.Array, trace: dict[str, jax.Array] | None = None, routing: jax.Array | None = None
    ) -> jax.Array:
        """x [B, T, H] -> [B, T, H]. `routing` [B, T, k] int: teacher-forced expert ids (validated by the caller,
        CausalLM, on the host: in [0, E), distinct per token)."""
        b, t, h = x.shape
        flat = x.reshape(b * t, h)  # [N, H]
        logits = self.router(flat)  # [N, E], activation dtype
        forced = None if routing is None else routing.reshape(b * t, self.top_k)  # [N, k]
        ids, weights = route(logits, self.top_k, self.norm_topk_prob, self.router_weights_float32, forced)
        outs = self.experts(flat, ids, self.dispatch)  # [N, k, H]
        experts_out = (outs * weights[..., None]).astype(x.dtype).sum(axis=1)  # [N, H]: each product rounded
        out = experts_out
        if self.shared_expert is not None:  # Qwen2-MoE: sigmoid(x Wg) * shared(x), added to the routed sum
            gate = jax.nn.sigmoid(self.shared_expert_gate(flat))  # [N, 1]
            shared_out = gate * self.shared_expert(flat)  # [N, H]
            out = experts_out + shared_out
        if trace is not None:
            name = f"layers.{self.layer_idx}.moe"
            trace[f"{name}.router_logits"] = logits.reshape(b, t, -1)
            trace[f"{name}.topk_ids"] = ids.reshape(b, t, -1)
            trace[f"{name}.topk_weights"] = weights.reshape(b, t, -1)
            trace[f"{name}.experts_out"] = experts_out.reshape(b, t, h)
            if self.shared_expert is not None:
                trace[f"{name}.shared_out"] = shared_out.reshape(b, t, h)
        return out.reshape(b, t, h)
