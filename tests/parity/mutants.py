"""The mutant catalogue: bugs a port typically has, each injected into ONE backend for one test only.

Every mutant is applied through a `pytest.MonkeyPatch` (undone when the test ends) to module-level functions
the backends look up at call time, or to the model a backend's `from_pretrained` returns (the package
attribute is wrapped; parity/capture.py looks it up at call time). Nothing here is reachable from the
product. `expect` is the component the parity report must name as the first divergence; `why` says why
that component and not an earlier one. This file is the catalogue (the `Mutant` row, the MUTANTS and SURVIVORS
tables); the patch functions the rows inject are tests/parity/mutant_patches.py.

JAX: `jax_impl.model.forward` is jitted with the graph static, so a patched function is only seen after
`jax.clear_caches()`; tests clear the caches before and after a JAX mutant (`Mutant.jax`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

import jax_impl
import kernels.pallas.reference as pallas_ref
import kernels.triton.reference as triton_ref
import torch_impl
from tests.parity.mutant_patches import (
    attend_without_softcap,
    causal_mask_off_by_one,
    embedding_scale_float32,
    final_norm_skips_increment,
    gelu_erf_and_mul_jax,
    group_heads_tiled,
    jax_act,
    local_rope_scaled,
    olmo2_qk_norm_per_head,
    parallel_residual_sequential,
    patch_loaded,
    patch_norm,
    rope_theta_ignored,
    rotary_full_head_jax,
    rotate_interleaved_jax,
    skip_qk_norm_jax,
    swap_gate_up,
    torch_act,
    torch_norm,
    untie_and_quantize_head,
    window_off_by_one_jax,
)


@dataclass(frozen=True)
class Mutant:
    name: str
    backend: str  # "torch" | "jax": where it is injected
    expect: str  # the component the report must name first
    why: str
    inject: Callable[[pytest.MonkeyPatch], None]
    # "default" or "large_eps" (tests/parity/conftest.py), or a FAMILY_CONFIGS name (tests/hf_configs.py)
    checkpoint: str = "default"
    dtype: str = "float32"  # bfloat16 for the bugs that only exist where the activation dtype rounds

    @property
    def jax(self) -> bool:
        return self.backend == "jax"


# ---- the table ------------------------------------------------------------------------------------------
MUTANTS: list[Mutant] = [
    Mutant(
        "rmsnorm_as_layernorm",
        "torch",
        "layers.0.input_norm",
        "the first norm is the first op after the (exact) embedding gather",
        torch_norm("layernorm"),
    ),
    Mutant(
        "gate_up_order_swapped",
        "torch",
        "layers.0.mlp.gate_up",
        "the merged projection's output halves trade places; everything before it is untouched",
        lambda mp: patch_loaded(mp, torch_impl, swap_gate_up),
    ),
    Mutant(
        "gelu_instead_of_silu",
        "jax",
        "layers.0.mlp.act",
        "the activation is the first op that uses it; gate_up is still right",
        jax_act("gelu"),
    ),
    Mutant("relu_instead_of_silu", "torch", "layers.0.mlp.act", "as gelu", torch_act("relu")),
    Mutant(
        "multiply_dropped_silu_gate_only",
        "torch",
        "layers.0.mlp.act",
        "act = silu(gate) ignores up: wrong from the activation on",
        torch_act("silu_only"),
    ),
    Mutant("silu_dropped_gate_times_up", "jax", "layers.0.mlp.act", "act = gate * up without SiLU", jax_act("no_silu")),
    Mutant(
        "tied_head_copied_and_quantized",
        "torch",
        "logits",
        "the embedding table itself is intact (embed matches); only the head's copy differs",
        lambda mp: patch_loaded(mp, torch_impl, untie_and_quantize_head),
    ),
    Mutant(
        "final_norm_misses_last_increment",
        "torch",
        "final_norm",
        "each layer's trace records x2 itself; only the final norm consumes the last increment",
        lambda mp: patch_loaded(mp, torch_impl, final_norm_skips_increment),
    ),
    Mutant(
        "eps_outside_sqrt",
        "torch",
        "layers.0.input_norm",
        "needs a visible eps: checkpoint with rms_norm_eps=0.1 (with 1e-6 the change is ~1e-6, below float32 "
        "noise of a correct model); the first norm is the first op it changes",
        torch_norm("eps_outside_sqrt"),
        checkpoint="large_eps",
    ),
    Mutant(
        "rope_interleaved",
        "jax",
        "layers.0.attn.q",
        "q is traced after RoPE (q comes before k); positions > 0 are rotated differently",
        lambda mp: mp.setattr(jax_impl.rotary_embedding, "rotate_half", rotate_interleaved_jax),
    ),
    Mutant(
        "gqa_repeat_not_interleave",
        "torch",
        "layers.0.attn_out",
        "q and k are traced before the heads are grouped; the attention output is the first to mix them "
        "(4 query heads on 2 kv heads: heads 1 and 2 read the wrong kv head)",
        lambda mp: mp.setattr(torch_impl.attention, "group_heads", group_heads_tiled),
    ),
    Mutant(
        "qk_norm_skipped",
        "jax",
        "layers.0.attn.q",
        "q is normalized (then rotated) before it is traced",
        lambda mp: patch_loaded(mp, jax_impl, skip_qk_norm_jax),
    ),
    Mutant(
        "causal_mask_off_by_one",
        "torch",
        "layers.0.attn_out",
        "the mask does not touch q or k; the attention output is the first to see a future token",
        lambda mp: mp.setattr(torch_impl.model, "causal_mask", causal_mask_off_by_one),
    ),
    Mutant(
        "rope_theta_ignored",
        "torch",
        "layers.0.attn.q",
        "theta 1e6 replaced by 10000 changes every rotation at positions > 0; q is traced after RoPE",
        lambda mp: patch_loaded(mp, torch_impl, rope_theta_ignored),
    ),
    # ---- issue 15: the model families (transformers-written checkpoints, tests/hf_configs.py FAMILY_CONFIGS) ----
    Mutant(
        "norm_offset_dropped",
        "jax",
        "layers.0.input_norm",
        "Gemma's RMSNorm scales by (1 + w); written as w it scales by ~0.1. The input norm is the first op after "
        "the (bit-identical) scaled embedding",
        patch_norm(pallas_ref, offset=False),
        checkpoint="gemma2_sandwich",
    ),
    Mutant(
        "embedding_scale_not_rounded",
        "torch",
        "embed",
        "bfloat16 only (in float32 the factor is float32 in both): sqrt(48) = 6.928 multiplied in float32 instead "
        "of bf16's 6.9375, a 0.13% change (~1/3 ulp) that flips the rounding of a quarter of the elements; the "
        "embedding is a gather and one multiply by a dtype constant, bit-identical in two correct backends",
        lambda mp: mp.setattr(torch_impl.model, "embedding_scale", embedding_scale_float32),
        checkpoint="gemma2_sandwich",
        dtype="bfloat16",
    ),
    Mutant(
        "gelu_erf_instead_of_tanh",
        "jax",
        "layers.0.mlp.act",
        "Gemma's GeGLU uses the tanh approximation; exact erf differs by up to ~1e-3 at |x| ~ 2; gate_up is still "
        "right",
        lambda mp: mp.setattr(pallas_ref, "gelu_tanh_and_mul_reference", gelu_erf_and_mul_jax),
        checkpoint="gemma2_sandwich",
    ),
    Mutant(
        "attn_softcap_dropped",
        "torch",
        "layers.0.attn_out",
        "the cap (4.0) acts on the scores inside attention; q and k are traced before it",
        attend_without_softcap,
        checkpoint="gemma2_sandwich",
    ),
    Mutant(
        "final_softcap_dropped",
        "torch",
        "logits",
        "the head's output (traced as `head`) is unchanged; only the cap (6.0) after it is missing",
        lambda mp: mp.setattr(torch_impl.model, "final_softcap", lambda logits, cap: logits),
        checkpoint="gemma2_sandwich",
    ),
    Mutant(
        "sliding_window_off_by_one",
        "jax",
        "layers.0.attn_out",
        "layer 0 slides (window 6); with 19 tokens every query past the 6th sees one key too many; the mask does "
        "not touch q or k",
        window_off_by_one_jax,
        checkpoint="gemma2_sandwich",
    ),
    Mutant(
        "rope_scaling_on_local_layers",
        "torch",
        "layers.0.attn.q",
        "Gemma 3's layer 0 is a sliding layer: its RoPE (base 1e4, unscaled) divided by the global layers' linear "
        "factor 8 changes every rotation at positions > 0; q is traced after RoPE",
        lambda mp: patch_loaded(mp, torch_impl, local_rope_scaled),
        checkpoint="gemma3_local_global",
    ),
    Mutant(
        "olmo2_qk_norm_per_head",
        "torch",
        "layers.0.attn.q",
        "OLMo 2 normalizes q over the whole projection (n * d), not over each head's d; q is normed before it is "
        "rotated and traced, and a post-norm layer has no input norm before it",
        olmo2_qk_norm_per_head,
        checkpoint="olmo2_post",
    ),
    Mutant(
        "parallel_residual_sequential",
        "torch",
        "layers.0.post_attn_norm",
        "the MLP's norm reads x + attn(ln1(x)) instead of x; the input norm and the attention before it are intact",
        parallel_residual_sequential,
        checkpoint="neox_parallel",
    ),
    Mutant(
        "partial_rotary_on_full_head",
        "jax",
        "layers.0.attn.q",
        "rotary_pct 0.5: only 6 of the 12 dims of a head rotate; rotating all 12 (with frequencies over 12) "
        "changes q at positions > 0; q is traced after RoPE",
        rotary_full_head_jax,
        checkpoint="neox_parallel",
    ),
]


# ---- below every tolerance: what parity.check cannot kill, and the narrower detector that sees it --------------
# The norm's weight multiply done in the activation dtype (double rounding: round(w * round(n)), and Gemma's
# (1 + w) itself rounded) where the family multiplies in float32 and rounds once. Its effect is at most ~1 ulp per
# element (measured, bf16: max_rel 1.0u-1.1u and rms_rel 0.8u-0.9u at its first norm, bound 8u / 6u) and it is the
# same kind of discrepancy XLA itself makes in correct code: on CPU, with xla_allow_excess_precision (the default),
# XLA drops intermediate bf16 roundings, so correct torch and JAX already differ in the last bit of 20%-85% of the
# elements of most layer-0 components (Gemma 2's input norm: 27%; the mutant: 40%). No tolerance on size, and no
# general count of differing roundings, separates the two. Where both correct backends do round alike, the
# mutant's rounding point shows as a count: OLMo 2's layer 0 attn.q (float32-weight q norm, rounded once)
# differs in 0 of 2128 elements between correct backends and in 28% with the mutant (`rounding_flips` in
# tests/parity/test_mutants.py checks both). With XLA_FLAGS=--xla_allow_excess_precision=false every layer-0
# component of the default and Gemma 2 checkpoints agrees bit for bit (<= 0.04% differ), which would make a
# depth-0 rounding-agreement criterion in parity.check sound; the parity environment does not set that flag.
SURVIVORS: list[Mutant] = [
    Mutant(
        "norm_weight_multiply_in_bf16",
        "torch",
        "layers.0.attn.q",
        "OLMo 2's first norm is the projection-wide q norm, traced after RoPE as attn.q; its float32 weight multiply "
        "done after the cast to bf16 rounds twice",
        patch_norm(triton_ref, float32_weight=False),
        checkpoint="olmo2_post",
        dtype="bfloat16",
    ),
]
