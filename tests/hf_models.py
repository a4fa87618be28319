"""Checkpoints written by Hugging Face transformers' own classes: the independent reference.

Each config is a small random-init model covering one corner of the spec (tied/untied heads, GQA
ratios 1, 2 and 4, head_dim != hidden/heads, q/k/v bias, rope theta 1e6, llama3 and linear rope
scaling). Weights are re-drawn at a scale that keeps activations O(1) (transformers' default init of
std 0.02 would make every component error vanishingly small and prove little), then saved with
`save_pretrained`, so the files are transformers' own safetensors, not the project's writer.
"""

from __future__ import annotations

import math
from pathlib import Path

HF_CONFIGS: dict[str, dict] = {
    # Qwen3: tied, GQA 2, head_dim 24 != 64/4, q/k norm, theta 1e6.
    "qwen3_tied_gqa2": dict(
        model_type="qwen3",
        vocab_size=301,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    ),
    # Qwen3: untied, GQA 4, head_dim 16 == 64/4.
    "qwen3_untied_gqa4": dict(
        model_type="qwen3",
        vocab_size=257,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10_000.0,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
    # Qwen2: q/k/v bias, GQA 1 (multi-head), tied.
    "qwen2_bias_mha": dict(
        model_type="qwen2",
        vocab_size=263,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    ),
    # Qwen2: q/k/v bias, untied head, GQA 3 (training parity's untied-bias case).
    "qwen2_bias_untied": dict(
        model_type="qwen2",
        vocab_size=211,
        hidden_size=48,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
    # Llama: llama3 rope scaling, GQA 2, untied, head_dim 20 != 48/4... (explicit).
    "llama3_scaled": dict(
        model_type="llama",
        vocab_size=311,
        hidden_size=48,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=20,
        rope_theta=500_000.0,
        tie_word_embeddings=False,
        max_position_embeddings=512,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    # Llama: linear rope scaling, GQA 4, tied.
    "llama_linear_gqa4": dict(
        model_type="llama",
        vocab_size=199,
        hidden_size=32,
        intermediate_size=88,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        rope_theta=10_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=256,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    ),
}


def build_hf_model(name: str, seed: int = 0):
    """A transformers model for HF_CONFIGS[name] with O(1)-scale random weights (float32)."""
    import torch
    import transformers

    kwargs = dict(HF_CONFIGS[name])
    model_type = kwargs.pop("model_type")
    config_cls = {
        "qwen3": transformers.Qwen3Config,
        "qwen2": transformers.Qwen2Config,
        "llama": transformers.LlamaConfig,
    }[model_type]
    model_cls = {
        "qwen3": transformers.Qwen3ForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "llama": transformers.LlamaForCausalLM,
    }[model_type]
    scaling = kwargs.pop("rope_scaling", None)
    config = config_cls(**kwargs, rms_norm_eps=1e-6, hidden_act="silu")
    if scaling is not None:  # the newer config form; transformers standardizes either
        config.rope_parameters = {"rope_theta": kwargs["rope_theta"], **scaling}
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            elif pname.endswith("bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
            elif "embed_tokens" in pname:
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))  # as spec.random_weights
            else:
                param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(param.shape[1]))
    return model


def save_hf_checkpoint(name: str, directory: Path, seed: int = 0) -> Path:
    model = build_hf_model(name, seed)
    model.save_pretrained(directory)
    return directory
