"""The tolerance tables: one per activation dtype, with the reason for every number beside it.

A component passes when all of these hold (parity/compare.py):

    max_rel  = max|a - b| / max|b|     <=  MAX_REL * g
    cosine   = <a, b> / (|a| |b|)       >=  1 - (RMS_REL * g)^2 / 2
    logits:  max KL(p_ref || p_test)    <=  (RMS_REL * g * rms(ref logits))^2 / 2
    both arrays finite, same shape

with g = sqrt(1 + layers before the component) (1 for embed and layer 0, sqrt(1 + i) for layer i,
sqrt(1 + L) for final_norm and logits). u below is the dtype's unit roundoff (half an ulp at 1.0).

Never loosen a number here to make a check pass: a failure is a finding. The figures quoted as "measured"
come from the built-in default checkpoint (2 layers, hidden 64) and from a Qwen3-0.6B-shaped random
checkpoint (28 layers, hidden 1024, intermediate 3072, vocab 151936, seq 128).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

GROWTH_REASON = (
    "Rounding discrepancies between two correct implementations are independent from op to op, so they add "
    "like a random walk as the residual stream carries them through the layers: every bound grows as "
    "g = sqrt(1 + layers before the component). Measured (bf16, 28 layers): x2's max_rel is 1.2u, 2.6u, 4u, "
    "6.2u after 0, 3, 9, 27 layers, i.e. ~1.2u * g; float32's grows from 6e-7 to 2e-6 over the same depth."
)
COSINE_REASON = (
    "For an error e uncorrelated with b, 1 - cos = |e|^2 / (2 |b|^2) to second order, so a bound on the "
    "rms-relative error |e| / |b| is a bound on 1 - cos. Cosine catches a small error spread over every "
    "element (e.g. a wrong rounding everywhere) that max_rel, a worst-element metric, can hide."
)
KL_REASON = (
    "For a small logit perturbation d, KL(p || q) = Var_p(d) / 2 to second order; a perturbation at the rms "
    "tolerance has Var_p(d) ~ (RMS_REL * g * rms(logits))^2. The bound therefore scales with the logits: "
    "bf16 logits of magnitude ~300 (random 1024-wide tied models) have an ulp of 2, and their softmax "
    "legitimately moves by 0.08 nats (measured) between two correct implementations."
)
EXACT_COMPONENTS = ("embed",)
EXACT_REASON = (
    "Held to bit identity (max_abs = 0), in every dtype, between two runs at the same dtype: the embedding is a row "
    "gather, times sqrt(hidden) rounded to the dtype where the family scales it (Gemma). A product of two values of "
    "the dtype is exact in float32 and rounded once, so every correct framework and device gives the same bits "
    "(measured: 0 differing elements on every family checkpoint, torch vs JAX vs transformers, float32 and "
    "bfloat16). Any difference is a finding however small: the scale multiplied in float32 instead of rounded to "
    "bf16 (Gemma's 6.9282 vs 6.9375 at H = 48) moves the embedding by 1.4u at most, inside 8u, yet changes 23% of "
    "its elements. Not applied where the reference is not in the dtype (a float32 drift baseline)."
)
TOP1_REASON = (
    "Reported, not a criterion: the top-1 token can only change where the reference's top-2 margin is below "
    "2 * max|d|, which max_rel already bounds; near-ties flip legitimately in low precision."
)
ROUTING_REASON = (
    "A mixture-of-experts layer's choice of experts is a near-tie, reported and not a failure, when the tested run "
    "swaps expert a (the reference's) for b and the reference's router logits satisfy l[a] - l[b] <= 2 * max_rel * "
    "g * max|router_logits of that layer|: twice the largest logit difference this table admits between two correct "
    "runs at that depth (the moe.router_logits component is held to it), so either order of a and b is consistent "
    "with logits both within tolerance. For a flip two correct runs can make, a and b are the reference's k-th and "
    "(k+1)-th experts and the margin is the k-th/(k+1)-th margin. A swap with a larger margin cannot come from "
    "rounding the table allows and fails (a selection that disagrees with its own logits, or logits out of "
    "tolerance, which moe.router_logits names first). Exact ties (margin 0: two equal router rows) are near-ties in "
    "every dtype. Float32 at g = 1: 2e-5 of the largest logit (4.6e-5 to 1e-4 on the MoE test checkpoints, where no "
    "untied token's margin came within it: 100% agreement); bfloat16: 16u, 0.16 to 0.29 there, where torch and JAX "
    "measurably flip a token at a margin of one bf16 ulp of the logit (0.0078 to 0.016 in repeated runs)."
)


def routing_bound(tolerance: Tolerance, layer: int, scale: float) -> float:
    """The router-logit margin within which a flipped expert choice at `layer` is a near-tie (ROUTING_REASON)."""
    return 2.0 * tolerance.bound(layer).max_rel * scale


@dataclass(frozen=True)
class Bound:
    """The limits one component is held to (already scaled by depth)."""

    max_rel: float
    min_cosine: float
    rms_rel: float  # the rms-relative error the cosine bound corresponds to (KL derives from it too)

    def kl_max(self, ref_rms: float) -> float:
        return 0.5 * (self.rms_rel * ref_rms) ** 2


@dataclass(frozen=True)
class Tolerance:
    dtype: str
    unit_roundoff: float
    max_rel: float  # at g = 1
    max_rel_reason: str
    rms_rel: float  # at g = 1
    rms_rel_reason: str

    @staticmethod
    def growth(layers_before: int) -> float:
        return math.sqrt(1 + layers_before)

    def bound(self, layers_before: int) -> Bound:
        g = self.growth(layers_before)
        rms = self.rms_rel * g
        return Bound(max_rel=self.max_rel * g, min_cosine=1.0 - 0.5 * rms * rms, rms_rel=rms)

    def to_dict(self) -> dict:
        reasons = {"growth": GROWTH_REASON, "cosine": COSINE_REASON, "kl": KL_REASON, "top1": TOP1_REASON}
        reasons["routing"] = ROUTING_REASON
        return {**asdict(self), **reasons, "exact": {"components": list(EXACT_COMPONENTS), "reason": EXACT_REASON}}


_U32, _U16, _UBF16 = 2.0**-24, 2.0**-11, 2.0**-8  # unit roundoff of float32, float16, bfloat16

TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(
        dtype="float32",
        unit_roundoff=_U32,
        max_rel=1e-5,
        max_rel_reason=(
            "~170u. Both backends compute every op in float32 but sum dot products in different orders (BLAS vs "
            "XLA), which moves a length-K dot product by ~sqrt(K)*u of its scale (K up to ~1e4 in real models: "
            "~6e-6), plus ulp-level differences in exp, rsqrt, sin and cos. Measured: <= 6e-7 on the default "
            "checkpoint, <= 3e-6 after 28 layers of width 1024, so 1e-5 leaves >= 3x headroom; the smallest bug "
            "in the mutant suite moves its component by >= 2e-3, 200x above it."
        ),
        rms_rel=1e-5,
        rms_rel_reason=(
            "Same source and size as max_rel: reordered float32 sums spread over every element. Measured "
            "rms-relative errors <= 10u * g (6e-7) on the default checkpoint; 1 - cos <= 5e-11 at g = 1."
        ),
    ),
    "bfloat16": Tolerance(
        dtype="bfloat16",
        unit_roundoff=_UBF16,
        max_rel=8 * _UBF16,
        max_rel_reason=(
            "8u = 3.1e-2 = 4 bf16 ulps at the component's largest element. Both backends accumulate in float32 and "
            "round each op's output to bf16 once, but from float32 values that differ in their last bits (summation "
            "order; XLA on CPU also skips some intermediate bf16 roundings, xla_allow_excess_precision), so an "
            "element legitimately lands one ulp (up to 2u of its value) apart after any op, and those one-ulp "
            "flips feed the next op. Measured: <= 2.4u * g on the default checkpoint, <= 2.2u * g over 28 "
            "layers of width 1024 (128 tokens): >= 3x headroom."
        ),
        rms_rel=6 * _UBF16,
        rms_rel_reason=(
            "6u = 2.3e-2. The typical element differs less than the worst one: measured rms-relative errors "
            "<= 2.1u * g on the default checkpoint and <= 1.7u * g over 28 layers (1 - cos <= 5e-4): >= 2.8x headroom."
        ),
    ),
    "float16": Tolerance(
        dtype="float16",
        unit_roundoff=_U16,
        max_rel=8 * _U16,
        max_rel_reason=(
            "8u = 3.9e-3, the bf16 rule with float16's unit roundoff: same float32 accumulation, same one-ulp "
            "flips at each rounding point (measured <= 1.5u * g on the default checkpoint). Overflow past 65504 "
            "is not a tolerance matter: any inf or NaN fails the component outright."
        ),
        rms_rel=6 * _U16,
        rms_rel_reason="6u = 2.9e-3, the bf16 rule with float16's unit roundoff (measured <= 1.2u * g).",
    ),
}


GRAD_GROWTH_REASON = (
    "A parameter's gradient depends on the whole forward pass (through the loss) and on the backward pass "
    "from the head down to its layer: for every tensor the two walks together cross about L layers, so every "
    "gradient's bound grows as g = sqrt(1 + L) (the forward rule's random walk over the layers both passes "
    "cross), whatever the tensor's own layer. Measured (float32): worst gradient max_rel 6e-7 at L = 2, "
    "4.6e-6 at L = 8 (hidden 128, 2 x 32 tokens), with no trend over the layers."
)

GRAD_TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(
        dtype="float32",
        unit_roundoff=_U32,
        max_rel=1e-5,
        max_rel_reason=(
            "~170u, the forward's float32 rule: reordered float32 sums (BLAS vs XLA), now over the backward's "
            "products as well, whose reductions run over tokens (weight gradients) and features (input "
            "gradients). Measured worst max_rel / g: 5e-7 (L = 2), 1.5e-6 (L = 8): >= 6x headroom; the smallest "
            "backward bug in the mutant suite moves its gradient by >= 1e-3."
        ),
        rms_rel=1e-5,
        rms_rel_reason="Same source as max_rel. Measured rms-relative errors <= 1.2e-6 * g (L = 8).",
    ),
    "bfloat16": Tolerance(
        dtype="bfloat16",
        unit_roundoff=_UBF16,
        max_rel=16 * _UBF16,
        max_rel_reason=(
            "16u = 6.3e-2, twice the forward's rule: a gradient is a sum over tokens of products of bf16 "
            "activations and bf16 upstream gradients, each of which carries the forward's one-ulp flips, and "
            "small reductions (the norms' weights: a sum over tokens and features of near-cancelling terms) "
            "turn them into a larger relative error of a small result. Measured worst max_rel between torch, "
            "JAX and transformers: 15u-20u at L = 8 (g = 3): 5u-6.5u * g, >= 2.4x headroom."
        ),
        rms_rel=12 * _UBF16,
        rms_rel_reason="12u = 4.7e-2. Measured rms-relative errors 10u-11u at L = 8: ~3.6u * g, >= 3.3x headroom.",
    ),
    "float16": Tolerance(
        dtype="float16",
        unit_roundoff=_U16,
        max_rel=16 * _U16,
        max_rel_reason="16u = 7.8e-3, the bf16 gradient rule with float16's unit roundoff.",
        rms_rel=12 * _U16,
        rms_rel_reason="12u = 5.9e-3, the bf16 gradient rule with float16's unit roundoff.",
    ),
}

STEP_REASON = (
    "After N AdamW steps each parameter is compared by its change from the start, rms-relative: "
    "||dp_test - dp_ref|| / ||dp_ref||. Adam divides each element's moment by its own RMS, so an element whose "
    "gradient is at the rounding level of the two implementations (|g| ~ 1e-8 of a 0.1-scale gradient) gets "
    "an update of either sign, up to lr: such elements are rare, so the rms over a tensor stays small while "
    "the max does not. Measured (float32, lr 1e-3, L = 2, 8 steps): <= 3.6e-4 after step 1, falling to 1.1e-4 "
    "after step 8 as the real updates add up and the noise does not; bound 2e-3 (5.5x headroom). A missing "
    "bias correction scales step 1 by 3.2 (rms_rel ~2), decay on a norm weight adds lr * wd * 1 per step "
    "(~1e-1 of its update). The key bias is left out (its elements in GPT-NeoX's fused qkv bias): its gradient "
    "is zero in exact arithmetic (softmax ignores the constant q . b_k it adds to a query's scores), so every "
    "element of it is noise-driven, not a rare one (measured: update rms_rel 1.7e-2 to 2.4e-2 between all "
    "three implementations on GPT-NeoX after 2 steps); the report lists what it left out. bfloat16: the same "
    "noise at bf16's level, and no longer rare. Adam's first update is lr * sign(g), so every element whose "
    "gradient is under the two implementations' bf16 gradient difference moves by lr either way, and the "
    "parameter's bf16 rounding (an update of lr = 1e-3 is ~8 ulps of a 0.02 weight) turns later differences into "
    "whole ulps. Measured between transformers and torch_impl, which share torch's fused AdamW so that only their "
    "bf16 gradients differ: 8.7e-2 to 2.0e-1 (default, Qwen3, Qwen2, Llama checkpoints; 1, 2, 4, 8 steps; "
    "largest after step 1); torch_impl vs jax_impl 6.7e-2 to 2.2e-1. Bound 0.5 (2.2x): it still kills a missing "
    "bias correction (~2) or a wrong learning rate, not a norm weight's decay (lr * wd * 1 = 1e-5 is below half "
    "an ulp of 1.0 in bf16: such weights do not move at all). float16 steps are refused (parity/api.py)."
)
STEP_RMS_REL = {"float32": 2e-3, "bfloat16": 0.5}  # float16: refused (parity/api.py says why)


def tolerance_for(dtype: str, *, grad: bool = False) -> Tolerance:
    """The table for an activation dtype name ("float32", "bfloat16", "float16"); `grad`: the gradients'."""
    from spec import InputError

    if dtype not in TOLERANCES:
        raise InputError(f"dtype {dtype!r} is not supported (choose one of {', '.join(TOLERANCES)})")
    return (GRAD_TOLERANCES if grad else TOLERANCES)[dtype]


def describe(tol: Tolerance) -> str:
    """The table as text: each number with its reason (printed by `decoder-parity check --tolerances`)."""
    lines = [
        f"{tol.dtype} (unit roundoff u = {tol.unit_roundoff:.3g}):",
        f"  max_rel <= {tol.max_rel:.3g} * g   {tol.max_rel_reason}",
        f"  rms_rel <= {tol.rms_rel:.3g} * g   {tol.rms_rel_reason}",
        f"  g = sqrt(1 + layers before)   {GROWTH_REASON}",
        f"  cosine >= 1 - (rms_rel * g)^2 / 2   {COSINE_REASON}",
        f"  logits KL <= (rms_rel * g * rms(ref logits))^2 / 2   {KL_REASON}",
        f"  top-1   {TOP1_REASON}",
        f"  MoE routing near-tie: margin <= 2 * max_rel * g * max|router logits|   {ROUTING_REASON}",
        f"  {', '.join(EXACT_COMPONENTS)}: bit-identical   {EXACT_REASON}",
    ]
    return "\n".join(lines)
