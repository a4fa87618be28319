"""The Hugging Face `config.json` for a ModelSpec: what the project's checkpoint writer puts beside the tensors.

The inverse of ModelSpec.from_hf_config (spec/families.py): a spec whose structure its model_type's config
cannot express (say, model_type "llama" with LayerNorm) is refused rather than written as a config that
transformers would read as another model. Written in the newer `rope_parameters` form.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from spec.errors import ConfigError
from spec.families import FULL, PADDING_ROW_DEFAULTS, SLIDING
from spec.rope import RopeScaling

ARCHITECTURES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}
_ACT_NAMES = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}


def _rope(theta: float, scaling: RopeScaling | None) -> dict[str, Any]:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if scaling is not None:
        rope.update({k: v for k, v in asdict(scaling).items() if v is not None})
    return rope


def hf_config(spec: Any) -> dict[str, Any]:
    """config.json for `spec` (a ModelSpec: spec/config.py imports this module, so it is not named here).

    ModelSpec.to_hf_config reads the result back and refuses a spec the config does not reproduce."""
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[spec.model_type]],
        "model_type": spec.model_type,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "rope_parameters": _rope(spec.rope_theta, spec.rope_scaling),
    }
    family = spec.model_type.removesuffix("_moe")  # a Qwen MoE config is the dense Qwen config plus _moe(spec)
    if family == "mixtral":
        family = "mistral"
    if family in ("qwen3", "qwen2", "llama", "mistral", "olmo2"):
        config.update(hidden_act="silu", rms_norm_eps=spec.rms_norm_eps, rope_theta=spec.rope_theta)
        if family != "qwen2":
            config["attention_bias"] = spec.attention_bias
        elif spec.model_type == "qwen2_moe":
            config["qkv_bias"] = True
        if family in ("qwen3", "qwen2"):
            sliding = bool(spec.layer_types)
            config.update(use_sliding_window=sliding, sliding_window=spec.sliding_window)
            if sliding:
                config.update(layer_types=list(spec.layer_types), max_window_layers=spec.layer_types.index(SLIDING))
        elif family == "mistral":
            config["sliding_window"] = spec.sliding_window
    elif family in ("gemma2", "gemma3_text"):
        config.update(
            hidden_activation=_ACT_NAMES[spec.hidden_act],
            rms_norm_eps=spec.rms_norm_eps,
            attention_bias=spec.attention_bias,
            query_pre_attn_scalar=_int_if_whole(spec.query_pre_attn_scalar),  # transformers 5's Gemma wants an int
            attn_logit_softcapping=spec.attn_logit_softcapping,
            final_logit_softcapping=spec.final_logit_softcapping,
            sliding_window=spec.sliding_window,
            layer_types=[spec.layer_type(i) for i in range(spec.num_hidden_layers)],
        )
        if family == "gemma3_text":
            local = _rope(spec.local_rope_theta or spec.rope_theta, spec.local_rope_scaling)
            config["rope_parameters"] = {FULL: config["rope_parameters"], SLIDING: local}
    elif family == "gpt_neox":
        if spec.o_proj_bias != spec.attention_bias:
            raise ConfigError("gpt_neox's config has one attention_bias for qkv and o_proj; the spec has two values")
        config.update(
            hidden_act=_ACT_NAMES[spec.hidden_act],
            layer_norm_eps=spec.rms_norm_eps,
            use_parallel_residual=spec.parallel_residual,
            attention_bias=spec.attention_bias,
            rotary_emb_base=spec.rope_theta,
            rotary_pct=spec.partial_rotary_factor,
        )
        config["rope_parameters"]["partial_rotary_factor"] = spec.partial_rotary_factor
        del config["head_dim"], config["num_key_value_heads"]
    if spec.model_type in PADDING_ROW_DEFAULTS:  # null where the spec has none (absent would read as the default)
        config["pad_token_id"] = spec.pad_token_id
    if spec.num_experts:
        config.update(_moe(spec))
    return config


def _moe(spec: Any) -> dict[str, Any]:
    """The mixture-of-experts keys of a config (spec/families.py reads them back)."""
    if spec.model_type == "mixtral":  # experts are intermediate_size wide; renormalized top-k, no key for it
        return {
            "num_local_experts": spec.num_experts,
            "num_experts_per_tok": spec.num_experts_per_tok,
            "intermediate_size": spec.moe_intermediate_size,
        }
    config = {
        "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "norm_topk_prob": spec.norm_topk_prob,
        "decoder_sparse_step": spec.decoder_sparse_step,
        "mlp_only_layers": list(spec.mlp_only_layers),
    }
    if spec.model_type == "qwen2_moe":
        config["shared_expert_intermediate_size"] = spec.shared_expert_intermediate_size
    return config


def _int_if_whole(value: float | None) -> float | int | None:
    """256.0 -> 256: the Gemma config classes of transformers 5 refuse a float query_pre_attn_scalar."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
