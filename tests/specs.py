"""Small spec variants that several test modules build checkpoints from (the default is spec.DEFAULT_SPEC)."""

from __future__ import annotations

from spec import ModelSpec

# Untied Qwen2 with q/k/v bias and a single kv head: the vocabulary (301) is padded at every tensor-parallel
# degree and the kv head is replicated at every degree > 1.
QWEN2_SINGLE_KV = ModelSpec(
    model_type="qwen2",
    vocab_size=301,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=10_000.0,
    rope_scaling=None,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    attention_bias=True,
    qk_norm=False,
)
