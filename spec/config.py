"""`ModelSpec`: the one framework-neutral description of the decoder that both backends read.

Built from a Hugging Face `config.json` for model_type qwen3, qwen2, llama and mistral, in both the
older form (top-level `rope_theta`, `rope_scaling`) and the newer `rope_parameters` form. Whatever the
spec cannot represent (LayerNorm, MoE, sliding window, an unknown rope type, an activation other than
SiLU, MLP bias) is refused with a `ConfigError` that names the key and its value. Every key read here
has a type and a range (spec/json_fields.py): JSON `true` is not a number, `"false"` is not a boolean,
NaN and Infinity are not finite. Every field here is read by both backends; a field nobody reads is a bug.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spec.errors import ConfigError
from spec.json_fields import MAX_SIZE, Fields, is_int, is_number, load_json

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")
# Keys whose presence (with a non-trivial value) means an architecture this spec does not implement.
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: `linear` (positions / factor) or `llama3` (banded, Llama 3.1)."""

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None


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
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2); o_proj never does here
    qk_norm: bool  # Qwen3: per-head RMSNorm on q and k before RoPE

    def __post_init__(self) -> None:
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
            value = getattr(self, name)
            if not is_int(value) or not 1 <= value <= MAX_SIZE:
                raise ConfigError(f"config key {name!r} must be an integer in [1, {MAX_SIZE}], got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention needs it)"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for rotate-half RoPE")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not is_number(value) or value <= 0:
                raise ConfigError(f"config key {name!r} must be a finite number > 0, got {value!r}")
        for name in ("tie_word_embeddings", "attention_bias", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"config key {name!r} must be true or false, got {getattr(self, name)!r}")

    @property
    def num_kv_groups(self) -> int:
        """Query heads per key/value head (1 = multi-head, > 1 = grouped-query)."""
        return self.num_attention_heads // self.num_key_value_heads

    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies [head_dim // 2] in float32, scaling applied; shared by both backends."""
        return rope_inv_freq(self)

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
            raise ConfigError(
                f"config key 'model_type' = {model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        _reject_unsupported(fields, model_type)
        hidden = fields.integer("hidden_size")
        heads = fields.integer("num_attention_heads")
        head_dim = fields.integer("head_dim", None)
        if head_dim is None:
            if hidden % heads:
                raise ConfigError(
                    f"no 'head_dim' in config and hidden_size={hidden!r} is not divisible by "
                    f"num_attention_heads={heads!r}"
                )
            head_dim = hidden // heads
        theta, scaling = _rope(fields)
        # Qwen2 always has q/k/v bias; its config has no key for it.
        attention_bias = True if model_type == "qwen2" else fields.boolean("attention_bias", False)
        return cls(
            model_type=model_type,
            vocab_size=fields.integer("vocab_size"),
            hidden_size=hidden,
            intermediate_size=fields.integer("intermediate_size"),
            num_hidden_layers=fields.integer("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=fields.integer("num_key_value_heads", heads),
            head_dim=head_dim,
            rms_norm_eps=fields.number("rms_norm_eps"),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=fields.integer("max_position_embeddings"),
            tie_word_embeddings=fields.boolean("tie_word_embeddings", False),
            attention_bias=attention_bias,
            qk_norm=model_type == "qwen3",
        )

    def to_hf_config(self) -> dict[str, Any]:
        """The config.json a Hugging Face loader reads for this spec (newer `rope_parameters` form)."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope.update({k: v for k, v in asdict(self.rope_scaling).items() if v is not None})
        arch = {
            "qwen3": "Qwen3ForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "llama": "LlamaForCausalLM",
            "mistral": "MistralForCausalLM",
        }[self.model_type]
        config: dict[str, Any] = {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "use_sliding_window": False,
            "sliding_window": None,
        }
        if self.model_type != "qwen2":
            config["attention_bias"] = self.attention_bias
        return config


def _reject_unsupported(fields: Fields, model_type: str) -> None:
    act = fields.string("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"config key 'hidden_act' = {act!r} is not supported (only silu: SwiGLU)")
    for key in _MOE_KEYS:
        if fields.integer(key, 0, minimum=0):
            raise ConfigError(f"config key {key!r} = {fields.value(key)!r}: mixture-of-experts is not supported")
    if fields.boolean("use_sliding_window", False):
        raise ConfigError("config key 'use_sliding_window' = true: sliding-window attention is not supported")
    window = fields.integer("sliding_window", None, minimum=0)
    if model_type == "mistral" and window is not None:
        raise ConfigError(
            f"config key 'sliding_window' = {window!r}: sliding-window "
            "attention is not supported (set it to null for full attention)"
        )
    other = sorted({t for t in fields.strings("layer_types") or () if t != "full_attention"})
    if other:
        raise ConfigError(f"config key 'layer_types' contains {other}: only 'full_attention' is supported")
    if fields.boolean("mlp_bias", False):
        raise ConfigError("config key 'mlp_bias' = true is not supported (SwiGLU without bias)")
    for key in ("parallel_residual", "use_parallel_residual"):
        if fields.boolean(key, False):
            raise ConfigError(f"config key {key!r} = true is not supported (sequential pre-norm only)")
    for key in ("norm_type", "layer_norm_type"):
        norm = fields.string(key, None)
        if norm is not None and "rms" not in norm.lower():
            raise ConfigError(f"config key {key!r} = {norm!r} is not supported (RMSNorm only)")
    if fields.value("layer_norm_eps") is not None and fields.value("rms_norm_eps") is None:
        raise ConfigError(
            f"config key 'layer_norm_eps' = {fields.value('layer_norm_eps')!r}: LayerNorm models "
            "are not supported (RMSNorm only)"
        )
    partial = fields.number("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise ConfigError(f"config key 'partial_rotary_factor' = {partial!r} is not supported (full rotary only)")


def _rope(fields: Fields) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from either config form; `rope_parameters` wins where both are present."""
    params = fields.nested("rope_parameters")
    if params is None:
        params = fields.nested("rope_scaling") or Fields({}, ConfigError, prefix="rope_scaling.")
        theta = fields.number("rope_theta", 10000.0)
    else:
        theta = params.number("rope_theta", None)
        theta = fields.number("rope_theta", 10000.0) if theta is None else theta
    rope_type = params.string("rope_type", None) or params.string("type", "default")
    if rope_type == "default":
        return theta, None
    if rope_type not in ("linear", "llama3"):
        raise ConfigError(
            f"config key '{params.prefix}rope_type' = {rope_type!r} is not supported "
            "(supported: default, linear, llama3)"
        )
    factor = params.number("factor")
    if rope_type == "linear":
        return theta, RopeScaling("linear", factor)
    low, high = params.number("low_freq_factor"), params.number("high_freq_factor")
    if high <= low:
        raise ConfigError(
            f"config key '{params.prefix}high_freq_factor' = {high!r} must exceed low_freq_factor = {low!r}"
        )
    original = params.integer("original_max_position_embeddings")
    return theta, RopeScaling("llama3", factor, low, high, original)


def rope_inv_freq(spec: ModelSpec) -> np.ndarray:
    """Inverse frequencies theta^(-2i/d), then the spec's scaling, as Hugging Face computes them.

    Computed in float64 and rounded once to float32, so both backends start from identical bits.
    """
    d = spec.head_dim
    inv = 1.0 / (spec.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))  # [d/2]
    scaling = spec.rope_scaling
    if scaling is None:
        pass
    elif scaling.rope_type == "linear":
        inv = inv / scaling.factor
    elif scaling.rope_type == "llama3":
        old_len = scaling.original_max_position_embeddings
        low_wavelen = old_len / scaling.low_freq_factor
        high_wavelen = old_len / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / scaling.factor, inv)
        smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)
