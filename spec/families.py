"""The model families a Hugging Face config can name, and the structure each one implies.

`read_structure(fields, model_type)` returns the ModelSpec fields that differ between families (norm kind and
placement, residual flow, activation, biases, rotary, attention variants) read from the config keys that
family's transformers config defines — never inferred from the word "transformer". Whatever a family's config
asks for that the spec cannot represent is refused naming the key and its value (docs/design.md, "Model
families"). Sizes common to every family (hidden, heads, vocabulary) are read by spec/config.py; the config-key
readers and refusals several families share (activation, sliding window, layer kinds) are spec/family_fields.py.
"""

from __future__ import annotations

from typing import Any

from spec.errors import ConfigError
from spec.family_fields import (
    FULL,  # the layer kinds: both backends and spec/hf_config.py import them from here
    SLIDING,
    activation,
    layer_types,
    plain_decoder,
    refuse_key,
    rope_fields,
    sliding_window,
)
from spec.json_fields import MAX_SIZE, Fields
from spec.rope import RopeScaling, global_rope, parse_rope

FAMILIES = (
    "qwen3",
    "qwen2",
    "llama",
    "mistral",
    "gemma2",
    "gemma3_text",
    "olmo2",
    "gpt_neox",
    "qwen3_moe",
    "qwen2_moe",
    "mixtral",
)
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral")
# The padding row (docs/design.md, "Training"): where transformers builds the embedding as
# nn.Embedding(vocab, hidden, padding_idx=config.pad_token_id), row pad_token_id gets no gradient from the lookup
# (a tied head's use of the table still gives it one). Family -> its config class's pad_token_id default, for the
# families whose model passes padding_idx: Llama, Mistral, Qwen2/3 (and their MoE), Mixtral: None; Gemma 2/3: 0;
# OLMo 2: 1. GPT-NeoX's `embed_in` has no padding_idx: absent here, its pad_token_id is not read (spec: None).
PADDING_ROW_DEFAULTS: dict[str, int | None] = {
    "qwen3": None,
    "qwen2": None,
    "llama": None,
    "mistral": None,
    "gemma2": 0,
    "gemma3_text": 0,
    "olmo2": 1,
    "qwen3_moe": None,
    "qwen2_moe": None,
    "mixtral": None,
}
# Keys whose presence (with a non-trivial value) means mixture-of-experts: refused outside the MoE families.
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def read_structure(fields: Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    """The family-specific ModelSpec fields of a config (see ModelSpec for what each means)."""
    _refuse_common(fields, model_type)
    reader = {
        "qwen3": _qwen,
        "qwen2": _qwen,
        "llama": _llama,
        "mistral": _mistral,
        "gemma2": _gemma,
        "gemma3_text": _gemma,
        "olmo2": _olmo2,
        "gpt_neox": _gpt_neox,
        "qwen3_moe": _qwen_moe,
        "qwen2_moe": _qwen_moe,
        "mixtral": _mixtral,
    }[model_type]
    return {**reader(fields, model_type, num_layers), "pad_token_id": _pad_token_id(fields, model_type)}


def _pad_token_id(fields: Fields, model_type: str) -> int | None:
    """The embedding's padding row (PADDING_ROW_DEFAULTS): absent -> the family's default, null -> none. Its range
    against vocab_size is checked by ModelSpec.from_hf_config."""
    if model_type not in PADDING_ROW_DEFAULTS:
        return None  # no padding_idx in this family's embedding: the key does not change the model
    if "pad_token_id" not in fields.obj:
        return PADDING_ROW_DEFAULTS[model_type]
    return fields.integer("pad_token_id", None, minimum=-MAX_SIZE)  # negative: from the end, checked with the vocab


def _refuse_common(fields: Fields, model_type: str) -> None:
    for key in _MOE_KEYS if model_type not in MOE_FAMILIES else ():
        if fields.integer(key, 0, minimum=0):
            raise ConfigError(f"config key {key!r} = {fields.value(key)!r}: mixture-of-experts is not supported")
    if fields.boolean("use_bidirectional_attention", False):
        raise ConfigError("config key 'use_bidirectional_attention' = true is not supported (causal decoders only)")


def _qwen(fields: Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    dense = model_type.removesuffix("_moe")
    plain_decoder(fields)
    # Qwen2/Qwen3: sliding window only when use_sliding_window, on layers from max_window_layers on.
    window = fields.integer("sliding_window", None, minimum=0) if fields.boolean("use_sliding_window", False) else None
    first = fields.integer("max_window_layers", num_layers, minimum=0)
    default = [SLIDING if window is not None and i >= first else FULL for i in range(num_layers)]
    types = layer_types(fields, num_layers, default, window)
    return {
        **rope_fields(fields),
        "rms_norm_eps": fields.number("rms_norm_eps"),
        # Qwen2 always has q/k/v bias; Qwen2-MoE's newer configs say so in `qkv_bias` (default true).
        "attention_bias": _qwen2_bias(fields, model_type)
        if dense == "qwen2"
        else fields.boolean("attention_bias", False),
        "qk_norm": dense == "qwen3",
        "sliding_window": window if types else None,
        "layer_types": types,
    }


def _qwen2_bias(fields: Fields, model_type: str) -> bool:
    if model_type == "qwen2_moe":
        refuse_key(fields, "qkv_bias", True, "Qwen2-MoE's q/k/v projections carry a bias")
    return True


def _qwen_moe(fields: Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    """Qwen3-MoE / Qwen2-MoE: the dense Qwen decoder with sparse layers (transformers' defaults)."""
    defaults = {"qwen3_moe": (128, 8, 768), "qwen2_moe": (60, 4, 1408)}[model_type]
    # Qwen3-MoE's config class stores `num_experts` as `num_local_experts` (an attribute map); both spellings occur.
    experts = fields.integer("num_experts", None, minimum=0)
    if experts is None:
        experts = fields.integer("num_local_experts", defaults[0], minimum=0)
    refuse_key(fields, "router_jitter_noise", 0.0, "training-time router noise is not modelled")
    moe = {
        "num_experts": experts,
        "num_experts_per_tok": fields.integer("num_experts_per_tok", defaults[1]),
        "moe_intermediate_size": fields.integer("moe_intermediate_size", defaults[2]),
        "norm_topk_prob": fields.boolean("norm_topk_prob", False),
        "decoder_sparse_step": fields.integer("decoder_sparse_step", 1),
        "mlp_only_layers": tuple(fields.integers("mlp_only_layers") or ()),
    }
    if model_type == "qwen2_moe":
        moe["shared_expert_intermediate_size"] = fields.integer("shared_expert_intermediate_size", 5632)
    else:
        refuse_key(fields, "shared_expert_intermediate_size", None, "Qwen3-MoE has no shared expert")
    return {**_qwen(fields, model_type, num_layers), **moe}


def _mixtral(fields: Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    """Mixtral: Mistral's decoder, every layer sparse, top-k renormalized, experts of `intermediate_size`."""
    plain_decoder(fields)
    window = sliding_window(fields, None)
    refuse_key(fields, "router_jitter_noise", 0.0, "training-time router noise is not modelled")
    return {
        **rope_fields(fields),
        "rms_norm_eps": fields.number("rms_norm_eps"),
        "attention_bias": fields.boolean("attention_bias", False),
        "sliding_window": window,
        "layer_types": (SLIDING,) * num_layers if window is not None else (),
        "num_experts": fields.integer("num_local_experts", 8),
        "num_experts_per_tok": fields.integer("num_experts_per_tok", 2),
        "moe_intermediate_size": fields.integer("intermediate_size"),
        "norm_topk_prob": True,
        "router_weights_float32": True,
    }


def _llama(fields: Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    plain_decoder(fields)
    refuse_key(fields, "sliding_window", None, "Llama has full attention")
    layer_types(fields, num_layers, [FULL] * num_layers, None)
    return {
        **rope_fields(fields),
        "rms_norm_eps": fields.number("rms_norm_eps"),
        "attention_bias": fields.boolean("attention_bias", False),
    }


def _mistral(fields: Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    plain_decoder(fields)
    window = sliding_window(fields, 4096)
    if fields.value("layer_types") is not None:
        raise ConfigError("config key 'layer_types' is not read by Mistral (transformers ignores it: use Ministral)")
    return {
        **rope_fields(fields),
        "rms_norm_eps": fields.number("rms_norm_eps"),
        "attention_bias": fields.boolean("attention_bias", False),
        "sliding_window": window,
        "layer_types": (SLIDING,) * num_layers if window is not None else (),
    }


def _gemma(fields: Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    refuse_key(fields, "mlp_bias", False, "GeGLU without bias")
    window = sliding_window(fields, 4096)
    if model_type == "gemma2":  # every other layer slides, starting with layer 0
        pattern = 2
        theta, scaling, _ = global_rope(fields)
        local_theta, local_scaling = theta, scaling
    else:  # Gemma 3: `sliding_window_pattern - 1` sliding layers, then a full one; two RoPEs
        pattern = fields.integer("sliding_window_pattern", 6)
        (theta, scaling), (local_theta, local_scaling) = _gemma3_ropes(fields)
    default = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    types = layer_types(fields, num_layers, default, window)
    return {
        "rope_theta": theta,
        "rope_scaling": scaling,
        "local_rope_theta": local_theta if model_type == "gemma3_text" else None,
        "local_rope_scaling": local_scaling if model_type == "gemma3_text" else None,
        "rms_norm_eps": fields.number("rms_norm_eps"),
        "attention_bias": fields.boolean("attention_bias", False),
        "qk_norm": model_type == "gemma3_text",
        "norm_offset": 1.0,
        "norm_weight_float32": True,
        "norm_placement": "sandwich",
        "hidden_act": activation(fields, "hidden_activation", "gelu_pytorch_tanh", ("gelu_tanh", "gelu", "silu")),
        "embedding_scale": True,
        "query_pre_attn_scalar": fields.number("query_pre_attn_scalar"),
        "attn_logit_softcapping": fields.number("attn_logit_softcapping", None),
        "final_logit_softcapping": fields.number("final_logit_softcapping", None),
        "sliding_window": window if types else None,
        "layer_types": types,
    }


def _gemma3_ropes(fields: Fields) -> tuple[tuple[float, RopeScaling | None], tuple[float, RopeScaling | None]]:
    """((theta, scaling) of full layers, (theta, scaling) of sliding layers) from either Gemma 3 config form:
    older `rope_theta` + `rope_scaling` (full layers only) + `rope_local_base_freq`, or per-layer-type
    `rope_parameters` = {"full_attention": {...}, "sliding_attention": {...}}."""
    params = fields.nested("rope_parameters")
    if params is not None and (params.value(FULL) is not None or params.value(SLIDING) is not None):
        full = params.nested(FULL) or Fields({}, ConfigError, prefix=f"rope_parameters.{FULL}.")
        local = params.nested(SLIDING) or Fields({}, ConfigError, prefix=f"rope_parameters.{SLIDING}.")
        return parse_rope(full, fields.number("rope_theta", 1_000_000.0)), parse_rope(
            local, fields.number("rope_local_base_freq", 10_000.0)
        )
    theta, scaling, _ = global_rope(fields)
    if fields.value("rope_theta") is None and (params is None or params.value("rope_theta") is None):
        theta = 1_000_000.0  # Gemma 3's default for full layers
    return (theta, scaling), (fields.number("rope_local_base_freq", 10_000.0), None)


def _olmo2(fields: Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    plain_decoder(fields)
    refuse_key(fields, "sliding_window", None, "OLMo 2 has full attention")
    layer_types(fields, num_layers, [FULL] * num_layers, None)
    return {
        **rope_fields(fields),
        "rms_norm_eps": fields.number("rms_norm_eps"),
        "attention_bias": fields.boolean("attention_bias", False),
        "qk_norm": True,
        "qk_norm_scope": "projection",
        "norm_weight_float32": True,
        "norm_placement": "post",
    }


def _gpt_neox(fields: Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    theta, scaling, params = global_rope(fields, "rotary_emb_base")
    # partial rotary: `rotary_pct` (older), `partial_rotary_factor` (top level or in rope_parameters)
    partial = fields.number("rotary_pct", 0.25)
    partial = fields.number("partial_rotary_factor", partial)
    if params is not None:
        partial = params.number("partial_rotary_factor", partial)
    if partial > 1.0:
        raise ConfigError(f"config key 'partial_rotary_factor' = {partial!r} must be in (0, 1]")
    bias = fields.boolean("attention_bias", True)
    refuse_key(fields, "sliding_window", None, "GPT-NeoX has full attention")
    return {
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rms_norm_eps": fields.number("layer_norm_eps", 1e-5),
        "attention_bias": bias,
        "o_proj_bias": bias,
        "norm_type": "layer",
        "parallel_residual": fields.boolean("use_parallel_residual", True),
        "hidden_act": activation(fields, "hidden_act", "gelu", ("gelu", "gelu_tanh", "silu")),
        "gated_mlp": False,
        "mlp_bias": True,
        "fused_qkv": True,
        "partial_rotary_factor": partial,
    }
