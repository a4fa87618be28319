"""`ModelSpec`: the one framework-neutral description of the decoder that both backends read.

Built from a Hugging Face `config.json` for the families in spec/families.py (Qwen3, Qwen2, Llama, Mistral,
Gemma 2, Gemma 3 text, OLMo 2, GPT-NeoX; the mixture-of-experts Qwen3-MoE, Qwen2-MoE and Mixtral), in both the
older config form (top-level `rope_theta`, `rope_scaling`) and the newer `rope_parameters` form. Whatever the spec
cannot represent (DeepSeek-style MoE, an unknown rope
type or activation, a layer kind not listed) is refused with a `ConfigError` that names the key and its value.
Every key read has a type and a range (spec/json_fields.py): JSON `true` is not a number, `"false"` is not a
boolean, NaN and Infinity are not finite. Every field here is read by both backends; a field nobody reads is
a bug. The structural fields default to the Llama/Qwen decoder (pre-norm RMSNorm, SwiGLU, full attention).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spec.config_checks import SUPPORTED_MODEL_TYPES, check_spec
from spec.errors import ConfigError
from spec.families import FULL, SLIDING, read_structure
from spec.hf_config import hf_config
from spec.json_fields import Fields, load_json
from spec.rope import RopeScaling, rope_inv_freq


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float  # the eps of every norm, RMSNorm or LayerNorm (gpt_neox's layer_norm_eps)
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2, GPT-NeoX)
    qk_norm: bool  # a norm on q and k before RoPE (Qwen3, Gemma 3, OLMo 2)
    # Structure (docs/design.md, "Model families"); the defaults are the Llama/Qwen decoder.
    norm_type: str = "rms"  # "rms" | "layer" (LayerNorm with a bias: GPT-NeoX)
    norm_offset: float = 0.0  # the norm multiplies by (offset + weight): 1.0 in Gemma
    norm_weight_float32: bool = False  # weight multiply in float32, then the cast (Gemma, OLMo 2); else after
    norm_placement: str = "pre"  # "pre" | "sandwich" (Gemma: pre and post norms) | "post" (OLMo 2: post only)
    parallel_residual: bool = False  # x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX)
    hidden_act: str = "silu"  # "silu" | "gelu_tanh" | "gelu" (exact erf)
    gated_mlp: bool = True  # down(act(gate) * up); False: down(act(up)) (GPT-NeoX)
    mlp_bias: bool = False  # the MLP's projections carry biases (GPT-NeoX)
    o_proj_bias: bool = False  # o_proj carries a bias, added once after the row-parallel sum (GPT-NeoX)
    fused_qkv: bool = False  # one qkv projection laid out per head: rows [n, 3, d] (GPT-NeoX)
    qk_norm_scope: str = "head"  # "head": over each head's d (Qwen3, Gemma 3); "projection": over n*d (OLMo 2)
    partial_rotary_factor: float = 1.0  # RoPE on the first int(head_dim * factor) dims of each head (GPT-NeoX)
    embedding_scale: bool = False  # embeddings times sqrt(hidden) rounded to the activation dtype (Gemma)
    # the embedding row that gets no gradient from the lookup (transformers' padding_idx; spec/families.py,
    # PADDING_ROW_DEFAULTS): an id in [0, vocab_size) or None. A tied head still trains that row.
    pad_token_id: int | None = None
    query_pre_attn_scalar: float | None = None  # scores scaled by this ** -0.5 instead of head_dim ** -0.5
    attn_logit_softcapping: float | None = None  # scores -> cap * tanh(scores / cap) before the mask (Gemma 2)
    final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    sliding_window: int | None = None  # a sliding layer's query sees keys at slots q - window < k <= q
    layer_types: tuple[str, ...] = ()  # per layer "full_attention" | "sliding_attention"; () = all full
    local_rope_theta: float | None = None  # sliding layers' own RoPE (Gemma 3); None = the global one
    local_rope_scaling: RopeScaling | None = None
    # Mixture-of-experts (docs/design.md, "Mixture of experts"); num_experts = 0 is a dense model.
    num_experts: int = 0  # routed experts in each sparse layer
    num_experts_per_tok: int = 0  # k: experts each token is sent to
    moe_intermediate_size: int = 0  # one expert's I (a dense layer keeps intermediate_size)
    norm_topk_prob: bool = False  # the k selected probabilities are renormalized to sum to 1 (Mixtral: always)
    router_weights_float32: bool = False  # the routing weights stay float32 in the weighted sum (Mixtral); else
    # they are rounded to the activation dtype first (Qwen)
    decoder_sparse_step: int = 1  # layer i is sparse when (i + 1) % step == 0 and i is not in mlp_only_layers
    mlp_only_layers: tuple[int, ...] = ()  # layers that keep the dense MLP
    shared_expert_intermediate_size: int = 0  # a dense expert every token passes, behind a sigmoid gate (Qwen2-MoE)

    def __post_init__(self) -> None:
        check_spec(self)  # spec/config_checks.py: types, ranges, names, and the combinations refused by name

    def is_sparse(self, layer: int) -> bool:
        """Layer `layer` routes its tokens to experts (transformers' rule: decoder_sparse_step, mlp_only_layers)."""
        return (
            self.num_experts > 0 and layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if self.is_sparse(i))

    @property
    def num_kv_groups(self) -> int:
        """Query heads per key/value head (1 = multi-head, > 1 = grouped-query)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def rotary_dim(self) -> int:
        """How many leading dims of each head RoPE rotates (transformers' int(head_dim * factor))."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attention_scale(self) -> float:
        """The factor on q k^T: query_pre_attn_scalar ** -0.5 where the family sets it (Gemma), else d ** -0.5."""
        scalar = self.head_dim if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar
        return float(scalar) ** -0.5

    @property
    def pre_norm(self) -> bool:
        """The layer's input passes a norm before attention (the dual-variable flow applies); False for OLMo 2."""
        return self.norm_placement != "post"

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else FULL

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, or None where it attends to every earlier position."""
        return self.sliding_window if self.layer_type(layer) == SLIDING else None

    def inv_freq(self, layer_type: str = FULL) -> np.ndarray:
        """RoPE inverse frequencies [rotary_dim // 2] in float32 for layers of `layer_type`, scaling applied."""
        if layer_type == SLIDING and self.local_rope_theta is not None:
            return rope_inv_freq(self.rotary_dim, self.local_rope_theta, self.local_rope_scaling)
        return rope_inv_freq(self.rotary_dim, self.rope_theta, self.rope_scaling)

    @property
    def rope_kinds(self) -> tuple[str, ...]:
        """The layer types that need their own RoPE table: (FULL,) unless sliding layers have another RoPE."""
        if self.local_rope_theta is not None and SLIDING in self.layer_types:
            return (FULL, SLIDING)
        return (FULL,)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelSpec:
        """Read `config.json` from a checkpoint directory (or the file itself)."""
        path = Path(path)
        config_path = path / "config.json" if path.is_dir() else path
        if not config_path.is_file():
            raise ConfigError(f"no config.json at {config_path}")
        config = load_json(config_path, ConfigError)
        if not isinstance(config, dict):
            raise ConfigError(f"{config_path} must hold a JSON object, got {type(config).__name__}")
        return cls.from_hf_config(config)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelSpec:
        """Map a Hugging Face config dict onto the spec, refusing what the spec cannot represent."""
        fields = Fields(config, ConfigError)
        model_type = fields.string("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            hint = " (a multimodal Gemma 3 config: point at its text model, model_type gemma3_text)"
            raise ConfigError(
                f"config key 'model_type' = {model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)}){hint if model_type == 'gemma3' else ''}"
            )
        hidden = fields.integer("hidden_size")
        heads = fields.integer("num_attention_heads")
        layers = fields.integer("num_hidden_layers")
        head_dim = fields.integer("head_dim", None)
        if head_dim is None:
            if hidden % heads:
                raise ConfigError(
                    f"no 'head_dim' in config and hidden_size={hidden!r} is not divisible by "
                    f"num_attention_heads={heads!r}"
                )
            head_dim = hidden // heads
        structure = read_structure(fields, model_type, layers)
        vocab = fields.integer("vocab_size")
        pad = structure["pad_token_id"]
        if pad is not None and not -vocab <= pad < vocab:  # a shard's local_spec keeps the global id: checked here
            raise ConfigError(
                f"config key 'pad_token_id' = {pad!r} must be an id in [-{vocab}, vocab_size = {vocab}) or null"
            )
        if pad is not None and pad < 0:  # nn.Embedding's rule: -1 is the last row (old Llama configs write -1)
            structure["pad_token_id"] = pad + vocab
        return cls(
            model_type=model_type,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=fields.integer("intermediate_size"),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=fields.integer("num_key_value_heads", heads),
            head_dim=head_dim,
            max_position_embeddings=fields.integer("max_position_embeddings"),
            tie_word_embeddings=fields.boolean("tie_word_embeddings", model_type.startswith("gemma")),
            **{"qk_norm": False, **structure},
        )

    def to_hf_config(self) -> dict[str, Any]:
        """The config.json a Hugging Face loader reads for this spec (newer `rope_parameters` form).

        Read back and compared: a spec whose model_type's config cannot express its structure is refused."""
        config = hf_config(self)
        read_back = ModelSpec.from_hf_config(config)
        if read_back != self:
            diff = {k: v for k, v in asdict(self).items() if asdict(read_back)[k] != v}
            raise ConfigError(f"a {self.model_type} config.json cannot express this spec's {sorted(diff)}: {diff}")
        return config
