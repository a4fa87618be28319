"""Mixture-of-experts mutants (issue 18): the porting bugs MoE ports have shipped, each injected into ONE backend's
real code for one test (the style of tests/parity/mutants.py), must fail `check` at the component where the bug
enters: the routing ones at the first sparse layer's moe.topk_weights (the router's softmax, top-k and
renormalization), not at a later layer; the experts' at moe.experts_out; the shared gate's at moe.shared_out; a
dense layer made sparse at that layer's first MLP component. Float32, transformers-written MOE_CONFIGS checkpoints.

The routing bugs go into jax_impl.moe.route (a module function the jitted forward looks up when it is traced:
caches are cleared around each JAX mutant); the others into torch_impl's loaded model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_impl.moe
import parity
import torch_impl
from tests.parity.mutant_patches import patch_loaded
from tests.parity.mutants import Mutant

CHECK = dict(seq_len=12, batch=2, baseline=False)


# ---- routing (jax_impl.moe.route: logits [N, E] -> ids [N, k] int32, weights [N, k]) ----------------------------
def _finish(ids, weights, logits, norm: bool, keep_f32: bool):
    if norm:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return ids.astype(jnp.int32), weights if keep_f32 else weights.astype(logits.dtype)


def _softmax_after_top_k(logits, k, norm, keep_f32, forced=None):
    """top-k of the logits, then a softmax over the k selected: Mixtral's original form, a bug where the family
    takes the softmax over all E first and does not renormalize (Qwen, norm_topk_prob False)."""
    selected, ids = jax.lax.top_k(logits.astype(jnp.float32), k)  # [N, k]
    return _finish(ids, jax.nn.softmax(selected, axis=-1), logits, norm, keep_f32)


def _softmax_in_bf16(logits, k, norm, keep_f32, forced=None):
    """The router's softmax in bfloat16 (the logits cast down first), not float32."""
    probs = jax.nn.softmax(logits.astype(jnp.bfloat16), axis=-1).astype(jnp.float32)  # [N, E]
    weights, ids = jax.lax.top_k(probs, k)
    return _finish(ids, weights, logits, norm, keep_f32)


def _ids_off_by_one(logits, k, norm, keep_f32, forced=None):
    """The selected ids shifted by one (mod E) while the weights stay: a selection that disagrees with the logits."""
    ids, weights = _original_route(logits, k, norm, keep_f32, forced)
    return (ids + 1) % logits.shape[-1], weights


_original_route = jax_impl.moe.route


def _route(replacement=None) -> callable:
    """Patch jax_impl.moe.route with `replacement`, or with the original given norm=False (norm_topk_prob ignored)."""
    original = jax_impl.moe.route

    def ignored(logits, k, norm, keep_f32, forced=None):
        return original(logits, k, False, keep_f32, forced)

    return lambda mp: mp.setattr(jax_impl.moe, "route", replacement or ignored)


# ---- experts and the shared expert (torch_impl's loaded model) ---------------------------------------------------
def _sparse_blocks(model):
    return [layer.mlp for layer in model.model.layers if layer.sparse]


def _experts_rolled(model) -> None:
    """The loaded stack off by one: slot e holds expert e + 1's weights (a per-expert name parsed off by one)."""
    import torch

    for block in _sparse_blocks(model):
        for proj in (block.experts.gate_up_proj, block.experts.down_proj):
            proj.weight.copy_(torch.roll(proj.weight, -1, dims=0))


def _shared_gate_dropped(model) -> None:
    """Qwen2-MoE's shared expert added ungated: sigmoid(x Wsg^T) replaced by 1 (a gate logit of +inf)."""
    import torch

    for block in _sparse_blocks(model):
        block.shared_expert_gate.forward = lambda x: torch.full((*x.shape[:-1], 1), torch.inf, dtype=x.dtype)


def _mlp_only_layers_sparse(model) -> None:
    """mlp_only_layers ignored: the dense layer 1 is built sparse, and a lenient loader leaves the experts and
    router it finds no tensors for at their random initialization (as transformers does, with a warning)."""
    import torch

    from torch_impl.moe import SparseMoeBlock

    spec, dtype = model.spec, model.model.embed_tokens.weight.dtype
    gen = torch.Generator().manual_seed(0)
    for i in spec.mlp_only_layers:
        block = SparseMoeBlock(spec, i)
        with torch.no_grad():
            for param in block.parameters():
                param.copy_(torch.randn(param.shape, generator=gen) / np.sqrt(param.shape[-1]))
        layer = model.model.layers[i]
        layer.mlp, layer.sparse = block.to(dtype), True


def _loaded(change) -> callable:
    return lambda mp: patch_loaded(mp, torch_impl, change)


R = "first sparse layer's routing weights: the ids are the same (top-k of the logits = top-k of the softmax)"
MOE_MUTANTS = [
    Mutant("softmax_after_top_k", "jax", "layers.0.moe.topk_weights", R, _route(_softmax_after_top_k),
           "qwen2_moe_shared"),
    Mutant("mixtral_softmax_over_all_not_renormalized", "jax", "layers.0.moe.topk_weights", R, _route(),
           "mixtral_e5k2"),
    Mutant("norm_topk_prob_ignored", "jax", "layers.0.moe.topk_weights", R, _route(), "qwen3_moe_e6k4"),
    Mutant("router_softmax_in_bf16", "jax", "layers.0.moe.topk_weights",
           "the float32 router logits are right; their bf16 softmax moves every weight by ~2^-9",
           _route(_softmax_in_bf16), "qwen3_moe_e6k4"),
    Mutant("topk_ids_off_by_one", "jax", "layers.0.moe.topk_ids",
           "the logits are right, the selection is not: a flip far beyond the near-tie bound, named by token",
           _route(_ids_off_by_one), "mixtral_e5k2"),
    Mutant("shared_expert_gate_dropped", "torch", "layers.0.moe.shared_out",
           "the routed sum is right; the shared expert's output is not scaled by its gate",
           _loaded(_shared_gate_dropped), "qwen2_moe_shared"),
    Mutant("experts_permuted_by_one", "torch", "layers.0.moe.experts_out",
           "the router and its choices are right; each chosen expert computes with its neighbour's weights",
           _loaded(_experts_rolled), "mixtral_e5k2"),
    Mutant("mlp_only_layers_made_sparse", "torch", "layers.1.mlp.gate_up",
           "layer 1 is dense (mlp_only_layers): the mutated backend routes instead, so it records no mlp.gate_up",
           _loaded(_mlp_only_layers_sparse), "qwen3_moe_e6k4"),
]  # fmt: skip


def run(mutant: Mutant, hf_checkpoint):
    with pytest.MonkeyPatch.context() as mp:
        mutant.inject(mp)
        if mutant.jax:
            jax.clear_caches()  # the jitted forward would otherwise reuse the unmutated program
        try:
            return parity.check(hf_checkpoint(mutant.checkpoint), **CHECK)
        finally:
            if mutant.jax:
                jax.clear_caches()


@pytest.mark.parametrize("mutant", MOE_MUTANTS, ids=[m.name for m in MOE_MUTANTS])
def test_moe_mutant_is_killed_and_localized(hf_checkpoint, mutant):
    report = run(mutant, hf_checkpoint)
    assert not report.passed, f"{mutant.name} survived: {report.verdict_line()}"
    assert report.first_divergence == mutant.expect, (
        f"{mutant.name}: the report names {report.first_divergence}, expected {mutant.expect} ({mutant.why})"
    )
    assert mutant.expect in report.verdict_line()
    if mutant.expect.endswith("topk_ids"):  # a routing failure names the layer, token, slot, both experts, margin
        assert report.first_failure[1].reason.startswith("layer 0 routing: token (0, 0) slot ")
        assert "> bound" in report.first_failure[1].reason


def test_softmax_after_top_k_with_renormalization_is_an_equivalent_mutant(hf_checkpoint):
    """Not a bug where the family renormalizes (Qwen3-MoE with norm_topk_prob, Mixtral): softmax over the k
    selected logits is softmax over all E renormalized over the k, the same function. It survives, as it must,
    with the weights equal to float32 rounding."""
    equivalent = Mutant("softmax_after_top_k_renormalized", "jax", "layers.0.moe.topk_weights", "equivalent",
                        _route(_softmax_after_top_k), "qwen3_moe_e6k4")  # fmt: skip
    report = run(equivalent, hf_checkpoint)
    assert report.passed, report.format()
    weights = report.comparisons[0].result("layers.0.moe.topk_weights").metrics
    assert weights.max_rel < 1e-6  # the same math, summed in another order


def test_catalogue_covers_the_issue():
    """Issue 18's bug list, each with a mutant; routing ones localized to the first sparse layer's router."""
    names = {m.name for m in MOE_MUTANTS}
    assert names == {
        "softmax_after_top_k",
        "mixtral_softmax_over_all_not_renormalized",
        "norm_topk_prob_ignored",
        "router_softmax_in_bf16",
        "topk_ids_off_by_one",
        "shared_expert_gate_dropped",
        "experts_permuted_by_one",
        "mlp_only_layers_made_sparse",
    }
    routing = [m for m in MOE_MUTANTS if m.jax]
    assert all(m.expect.split(".", 2)[2].startswith("moe.") and m.expect.startswith("layers.0.") for m in routing)
    assert {m.backend for m in MOE_MUTANTS} == {"torch", "jax"}
