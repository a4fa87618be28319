"""Checkpoints written by Hugging Face transformers' own classes: the independent reference.

Each config (tests/hf_configs.py) is a small random-init model covering one corner of the spec. Weights are
re-drawn at a scale that keeps activations O(1) (transformers' default init of std 0.02 would make every component
error vanishingly small and prove little), then saved with `save_pretrained`, so the files are transformers' own
safetensors, not the project's writer.
"""

from __future__ import annotations

import math
from pathlib import Path

from tests.hf_configs import ALL_CONFIGS, TIED_ROUTER_CONFIGS

_CLASSES = {  # model_type -> (config class, model class) names in transformers
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
}


def build_hf_model(name: str, seed: int = 0):
    """A transformers model for ALL_CONFIGS[name] with O(1)-scale random weights (float32)."""
    import torch
    import transformers

    kwargs = dict(ALL_CONFIGS[name])
    model_type = kwargs.pop("model_type")
    config_name, model_name = _CLASSES[model_type]
    scaling = kwargs.pop("rope_scaling", None)
    if model_type in ("qwen3", "qwen2", "llama", "mistral", "olmo2", "qwen3_moe", "qwen2_moe", "mixtral"):
        kwargs.update(rms_norm_eps=1e-6, hidden_act="silu")
    config = getattr(transformers, config_name)(**kwargs)
    if scaling is not None:  # the newer config form; transformers standardizes either
        config.rope_parameters = {"rope_theta": kwargs["rope_theta"], **scaling}
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    gen = torch.Generator().manual_seed(seed)
    offset = 0.0 if model_type.startswith("gemma") else 1.0  # Gemma's norms scale by (1 + w)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight"):
                param.copy_(offset + 0.1 * torch.randn(param.shape, generator=gen))
            elif pname.endswith("bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
            elif "embed_tokens" in pname or "embed_in" in pname:
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))  # as spec.random_weights
            else:  # a Linear [out, in] or stacked experts [E, out, in]: fan-in is the last axis
                param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(param.shape[-1]))
        if name in TIED_ROUTER_CONFIGS:
            for pname, param in model.named_parameters():
                if pname.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
                    param[1].copy_(param[0])
    return model


def save_hf_checkpoint(name: str, directory: Path, seed: int = 0) -> Path:
    model = build_hf_model(name, seed)
    model.save_pretrained(directory)
    return directory
