"""The small configs of the checkpoints transformers' own classes write for the tests (tests/hf_models.py builds
them): one corner of the spec each (tied/untied heads, GQA ratios 1, 2 and 4, head_dim != hidden/heads, q/k/v bias,
rope theta 1e6, llama3 and linear rope scaling), the other model families, and the mixture-of-experts ones.
"""

from __future__ import annotations

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


# The other families (spec/families.py), each with the structure that sets it apart, at sizes that are not
# powers of two and sequence lengths (tests use 19+) longer than every sliding window. Soft-capping values are
# small enough that capping changes the O(1) scores and logits these weights give (a dropped cap must show).
FAMILY_CONFIGS: dict[str, dict] = {
    # Mistral: sliding window 7 on every layer, GQA 3, untied.
    "mistral_window": dict(
        model_type="mistral",
        vocab_size=211,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
        rope_theta=10_000.0,
        sliding_window=7,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
    # Gemma 2: (1 + w) float32 norms, sandwich norms, GeGLU (tanh), scaled embedding, soft-capped scores and
    # logits, query_pre_attn_scalar != head_dim, sliding window 6 on layers 0 and 2, GQA 2, tied.
    "gemma2_sandwich": dict(
        model_type="gemma2",
        vocab_size=307,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=20,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=4.0,
        final_logit_softcapping=6.0,
        sliding_window=6,
        rope_theta=10_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    ),
    # Gemma 3 (text): as Gemma 2 without caps, per-head (1 + w) q/k norm, sliding layers 0, 1, 3 (pattern 3)
    # with their own RoPE base, linear RoPE scaling on the full layer only, GQA 4.
    "gemma3_local_global": dict(
        model_type="gemma3_text",
        vocab_size=283,
        hidden_size=40,
        intermediate_size=72,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=5,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        tie_word_embeddings=True,
        max_position_embeddings=256,
    ),
    # OLMo 2: post-norm only, q/k norm over the whole projection, float32 norm weight math, GQA 2, untied.
    "olmo2_post": dict(
        model_type="olmo2",
        vocab_size=241,
        eos_token_id=2,  # transformers' default (50279) lies outside this vocabulary
        hidden_size=56,
        intermediate_size=88,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10_000.0,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
    # GPT-NeoX: LayerNorm with bias, parallel residual, fused per-head qkv, partial rotary (half of d=12),
    # exact GELU MLP with biases, untied.
    "neox_parallel": dict(
        model_type="gpt_neox",
        vocab_size=223,
        hidden_size=48,
        intermediate_size=136,
        num_hidden_layers=2,
        num_attention_heads=4,
        rotary_pct=0.5,
        rotary_emb_base=10_000.0,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
    # GPT-NeoX with the sequential residual and a quarter rotary (4 of d=16).
    "neox_sequential": dict(
        model_type="gpt_neox",
        vocab_size=229,
        hidden_size=64,
        intermediate_size=120,
        num_hidden_layers=2,
        num_attention_heads=4,
        rotary_pct=0.25,
        rotary_emb_base=10_000.0,
        use_parallel_residual=False,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
}
# Mixture-of-experts (issue 18): E = 6 (not a power of two) with k = 4, E = 4 with k = 2, a dense layer among
# sparse ones (mlp_only_layers), a shared expert, renormalized and plain top-k.
MOE_CONFIGS: dict[str, dict] = {
    # Qwen3-MoE: 6 experts, top-4 renormalized, layer 1 dense (mlp_only_layers), q/k norm, untied.
    "qwen3_moe_e6k4": dict(
        model_type="qwen3_moe",
        vocab_size=269,
        hidden_size=64,
        intermediate_size=88,
        moe_intermediate_size=40,
        num_experts=6,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
    # Qwen2-MoE: 4 experts, top-2 not renormalized, a shared expert behind its sigmoid gate, q/k/v bias, tied.
    "qwen2_moe_shared": dict(
        model_type="qwen2_moe",
        vocab_size=241,
        hidden_size=48,
        intermediate_size=72,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=56,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    ),
    # Mixtral: 5 experts, top-2 (softmax over the selected: renormalized), GQA 2.
    "mixtral_e5k2": dict(
        model_type="mixtral",
        vocab_size=251,
        hidden_size=64,
        intermediate_size=56,
        num_local_experts=5,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
}
# Exact router ties by construction: in every sparse layer expert 1's router row is a copy of expert 0's, so
# every token's two logits are equal; where the pair straddles the k-th place the choice is a tie-break.
TIED_ROUTER_CONFIGS = {"qwen3_moe_ties": dict(MOE_CONFIGS["qwen3_moe_e6k4"], mlp_only_layers=[])}
ALL_CONFIGS = {**HF_CONFIGS, **FAMILY_CONFIGS, **MOE_CONFIGS, **TIED_ROUTER_CONFIGS}
