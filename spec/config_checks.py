"""What a ModelSpec accepts: each field's type, range and allowed names, and the combinations refused by name.

`check_spec` is ModelSpec.__post_init__ (spec/config.py): every spec, however built (a config.json, a test, a
shard's local spec), passes it. Combinations whose math is undefined, or that no formula here covers, are
refused naming the fields (docs/design.md, "Model families"); the MoE fields are checked against the dense ones.
"""

from __future__ import annotations

from typing import Any

from spec.errors import ConfigError
from spec.families import FAMILIES, FULL, PADDING_ROW_DEFAULTS, SLIDING
from spec.family_fields import ACTIVATIONS
from spec.json_fields import MAX_SIZE, is_int, is_number

SUPPORTED_MODEL_TYPES = FAMILIES
NORM_TYPES = ("rms", "layer")
NORM_PLACEMENTS = ("pre", "sandwich", "post")
HIDDEN_ACTS = tuple(sorted(set(ACTIVATIONS.values())))
QK_NORM_SCOPES = ("head", "projection")


def check_spec(spec: Any) -> None:
    """Refuse `spec` (a ModelSpec: spec/config.py imports this module, so it is not named here) unless every
    field is in range and the combination is defined."""
    for name in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
    ):
        value = getattr(spec, name)
        if not is_int(value) or not 1 <= value <= MAX_SIZE:
            raise ConfigError(f"config key {name!r} must be an integer in [1, {MAX_SIZE}], got {value!r}")
    if spec.num_attention_heads % spec.num_key_value_heads:
        raise ConfigError(
            f"num_attention_heads={spec.num_attention_heads} is not a multiple of "
            f"num_key_value_heads={spec.num_key_value_heads} (grouped-query attention needs it)"
        )
    for name in ("rms_norm_eps", "rope_theta"):
        value = getattr(spec, name)
        if not is_number(value) or value <= 0:
            raise ConfigError(f"config key {name!r} must be a finite number > 0, got {value!r}")
    for name in (
        "tie_word_embeddings",
        "attention_bias",
        "qk_norm",
        "norm_weight_float32",
        "parallel_residual",
        "gated_mlp",
        "mlp_bias",
        "o_proj_bias",
        "fused_qkv",
        "embedding_scale",
        "norm_topk_prob",
        "router_weights_float32",
    ):
        if not isinstance(getattr(spec, name), bool):
            raise ConfigError(f"config key {name!r} must be true or false, got {getattr(spec, name)!r}")
    for name, allowed in (
        ("model_type", SUPPORTED_MODEL_TYPES),
        ("norm_type", NORM_TYPES),
        ("norm_placement", NORM_PLACEMENTS),
        ("hidden_act", HIDDEN_ACTS),
        ("qk_norm_scope", QK_NORM_SCOPES),
    ):
        if getattr(spec, name) not in allowed:
            raise ConfigError(f"{name} = {getattr(spec, name)!r} is not one of {allowed}")
    pad = spec.pad_token_id
    if pad is not None and (not is_int(pad) or not 0 <= pad <= MAX_SIZE):
        raise ConfigError(f"config key 'pad_token_id' must be an integer in [0, {MAX_SIZE}] or null, got {pad!r}")
    if pad is not None and spec.model_type not in PADDING_ROW_DEFAULTS:
        raise ConfigError(
            f"pad_token_id = {pad!r} but a {spec.model_type} embedding has no padding row (transformers builds "
            "it without padding_idx)"
        )
    _check_structure(spec)
    _check_moe(spec)


def _check_structure(spec: Any) -> None:
    """Combinations whose math is undefined (or that no formula here covers) are refused by name."""
    if spec.norm_offset not in (0.0, 1.0):
        raise ConfigError(f"norm_offset = {spec.norm_offset!r} must be 0.0 or 1.0 (Gemma's 1 + w)")
    if spec.norm_type == "layer" and (spec.norm_offset or spec.qk_norm):
        raise ConfigError("norm_type 'layer' (LayerNorm) has no weight offset and no q/k norm here")
    if spec.parallel_residual and spec.norm_placement != "pre":
        raise ConfigError(f"parallel_residual with norm_placement {spec.norm_placement!r} is not defined")
    if spec.fused_qkv and spec.qk_norm:
        raise ConfigError("fused_qkv with a q/k norm is not defined here (no family has both)")
    if spec.fused_qkv and spec.num_key_value_heads != spec.num_attention_heads:
        raise ConfigError("fused_qkv (GPT-NeoX's per-head qkv layout) needs num_key_value_heads == num_heads")
    factor = spec.partial_rotary_factor
    if not is_number(factor) or not 0 < factor <= 1:
        raise ConfigError(f"config key 'partial_rotary_factor' must be in (0, 1], got {factor!r}")
    if spec.rotary_dim < 2 or spec.rotary_dim % 2:
        raise ConfigError(
            f"rotary width int(head_dim * partial_rotary_factor) = {spec.rotary_dim} must be even and >= 2 "
            f"(head_dim={spec.head_dim}, partial_rotary_factor={factor}) for rotate-half RoPE"
        )
    for name in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "local_rope_theta"):
        value = getattr(spec, name)
        if value is not None and (not is_number(value) or value <= 0):
            raise ConfigError(f"config key {name!r} must be a finite number > 0 or null, got {value!r}")
    if spec.layer_types:
        if len(spec.layer_types) != spec.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(spec.layer_types)} entries but num_hidden_layers = {spec.num_hidden_layers}"
            )
        bad = sorted({t for t in spec.layer_types if t not in (FULL, SLIDING)})
        if bad:
            raise ConfigError(f"layer_types contains {bad}: only {FULL!r} and {SLIDING!r} are supported")
    sliding = SLIDING in spec.layer_types
    if sliding != (spec.sliding_window is not None):
        raise ConfigError(
            f"sliding_window = {spec.sliding_window!r} but layer_types has "
            f"{'a' if sliding else 'no'} sliding_attention layer: give both or neither"
        )
    if spec.sliding_window is not None and (not is_int(spec.sliding_window) or spec.sliding_window < 1):
        raise ConfigError(f"config key 'sliding_window' must be an integer >= 1 or null, got {spec.sliding_window!r}")


def _check_moe(spec: Any) -> None:
    for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"):
        value = getattr(spec, name)
        if not is_int(value) or not 0 <= value <= MAX_SIZE:
            raise ConfigError(f"config key {name!r} must be an integer in [0, {MAX_SIZE}], got {value!r}")
    step = spec.decoder_sparse_step
    if not is_int(step) or not 1 <= step <= MAX_SIZE:
        raise ConfigError(f"config key 'decoder_sparse_step' must be an integer in [1, {MAX_SIZE}], got {step!r}")
    bad = [i for i in spec.mlp_only_layers if not is_int(i) or not 0 <= i < spec.num_hidden_layers]
    if bad or len(set(spec.mlp_only_layers)) != len(spec.mlp_only_layers):
        raise ConfigError(
            f"config key 'mlp_only_layers' = {list(spec.mlp_only_layers)} must list distinct layer indices "
            f"in [0, {spec.num_hidden_layers})" + (f": {bad} are not" if bad else "")
        )
    if not spec.num_experts:
        moe = {
            n: getattr(spec, n)
            for n in ("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
            if getattr(spec, n)
        }
        if moe:
            raise ConfigError(f"num_experts = 0 (a dense model) but {moe} are set")
        return
    if not 1 <= spec.num_experts_per_tok <= spec.num_experts:
        raise ConfigError(
            f"config key 'num_experts_per_tok' = {spec.num_experts_per_tok} must be in [1, num_experts = "
            f"{spec.num_experts}]"
        )
    if spec.moe_intermediate_size < 1:
        raise ConfigError("config key 'moe_intermediate_size' must be >= 1 in a mixture-of-experts model")
    if not spec.gated_mlp or spec.mlp_bias or spec.parallel_residual or spec.norm_placement != "pre":
        raise ConfigError(
            "mixture-of-experts is defined here for the pre-norm decoder with gated, bias-free experts only"
        )
