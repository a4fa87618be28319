"""`ModelSpec`: the one framework-neutral description of the decoder that both backends read.

Built from a Hugging Face `config.json` for model_type qwen3, qwen2, llama and mistral, in both the
older form (top-level `rope_theta`, `rope_scaling`) and the newer `rope_parameters` form. Whatever the
spec cannot represent (LayerNorm, MoE, sliding window, an unknown rope type, an activation other than
SiLU, MLP bias) is refused with a `ConfigError` that names the key and its value. Every field here is
read by both backends; a field nobody reads is a bug.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spec.errors import ConfigError

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
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"config key {name!r} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention needs it)"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for rotate-half RoPE")
        if not (self.rms_norm_eps > 0):
            raise ConfigError(f"config key 'rms_norm_eps' must be > 0, got {self.rms_norm_eps!r}")
        if not (self.rope_theta > 0):
            raise ConfigError(f"config key 'rope_theta' must be > 0, got {self.rope_theta!r}")

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
        try:
            config = json.loads(config_path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{config_path} is not valid JSON: {err}") from err
        if not isinstance(config, dict):
            raise ConfigError(f"{config_path} must hold a JSON object, got {type(config).__name__}")
        return cls.from_hf_config(config)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelSpec:
        """Map a Hugging Face config dict onto the spec, refusing what the spec cannot represent."""
        model_type = _require(config, "model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"config key 'model_type' = {model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        _reject_unsupported(config, model_type)
        hidden = _require(config, "hidden_size")
        heads = _require(config, "num_attention_heads")
        head_dim = config.get("head_dim")
        if head_dim is None:
            if not isinstance(hidden, int) or not isinstance(heads, int) or heads < 1 or hidden % heads:
                raise ConfigError(
                    f"no 'head_dim' in config and hidden_size={hidden!r} is not divisible by "
                    f"num_attention_heads={heads!r}"
                )
            head_dim = hidden // heads
        kv_heads = config.get("num_key_value_heads")
        if kv_heads is None:
            kv_heads = heads
        theta, scaling = _rope(config)
        if model_type == "qwen2":
            attention_bias = True  # Qwen2 always has q/k/v bias; its config has no key for it
        else:
            attention_bias = config.get("attention_bias", False)
        if not isinstance(attention_bias, bool):
            raise ConfigError(f"config key 'attention_bias' must be true or false, got {attention_bias!r}")
        return cls(
            model_type=model_type,
            vocab_size=_require(config, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_require(config, "intermediate_size"),
            num_hidden_layers=_require(config, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(_require(config, "rms_norm_eps")),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=_require(config, "max_position_embeddings"),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
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


def _require(config: dict[str, Any], key: str) -> Any:
    if key not in config or config[key] is None:
        raise ConfigError(f"config.json lacks the required key {key!r}")
    return config[key]


def _reject_unsupported(config: dict[str, Any], model_type: str) -> None:
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"config key 'hidden_act' = {act!r} is not supported (only silu: SwiGLU)")
    for key in _MOE_KEYS:
        if config.get(key):
            raise ConfigError(f"config key {key!r} = {config[key]!r}: mixture-of-experts is not supported")
    if config.get("use_sliding_window"):
        raise ConfigError("config key 'use_sliding_window' = true: sliding-window attention is not supported")
    if model_type == "mistral" and config.get("sliding_window") is not None:
        raise ConfigError(
            f"config key 'sliding_window' = {config['sliding_window']!r}: sliding-window "
            "attention is not supported (set it to null for full attention)"
        )
    layer_types = config.get("layer_types")
    if layer_types is not None:
        other = sorted({t for t in layer_types if t != "full_attention"})
        if other:
            raise ConfigError(f"config key 'layer_types' contains {other}: only 'full_attention' is supported")
    if config.get("mlp_bias"):
        raise ConfigError("config key 'mlp_bias' = true is not supported (SwiGLU without bias)")
    if config.get("parallel_residual") or config.get("use_parallel_residual"):
        raise ConfigError("config key 'parallel_residual' = true is not supported (sequential pre-norm only)")
    norm = config.get("norm_type") or config.get("layer_norm_type")
    if norm is not None and "rms" not in str(norm).lower():
        raise ConfigError(f"config key 'norm_type' = {norm!r} is not supported (RMSNorm only)")
    if "layer_norm_eps" in config and "rms_norm_eps" not in config:
        raise ConfigError(
            f"config key 'layer_norm_eps' = {config['layer_norm_eps']!r}: LayerNorm models "
            "are not supported (RMSNorm only)"
        )
    partial = config.get("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise ConfigError(f"config key 'partial_rotary_factor' = {partial!r} is not supported (full rotary only)")


def _rope(config: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from either config form; `rope_parameters` wins where both are present."""
    params = config.get("rope_parameters")
    source = "rope_parameters"
    if params is None:
        params = config.get("rope_scaling") or {}
        source = "rope_scaling"
        theta = config.get("rope_theta", 10000.0)
    else:
        if not isinstance(params, dict):
            raise ConfigError(f"config key 'rope_parameters' must be an object, got {params!r}")
        theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    if not isinstance(params, dict):
        raise ConfigError(f"config key {source!r} must be an object or null, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    factor = params.get("factor")
    if not isinstance(factor, (int, float)) or factor <= 0:
        raise ConfigError(
            f"config key '{source}.factor' must be a positive number for rope_type {rope_type!r}, got {factor!r}"
        )
    if rope_type == "linear":
        return float(theta), RopeScaling("linear", float(factor))
    if rope_type == "llama3":
        missing = [
            k
            for k in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            if params.get(k) is None
        ]
        if missing:
            raise ConfigError(f"config key {source!r} with rope_type 'llama3' lacks {missing}")
        if params["high_freq_factor"] <= params["low_freq_factor"]:
            raise ConfigError(
                f"config key '{source}.high_freq_factor' = {params['high_freq_factor']!r} must "
                f"exceed low_freq_factor = {params['low_freq_factor']!r}"
            )
        return float(theta), RopeScaling(
            "llama3",
            float(factor),
            float(params["low_freq_factor"]),
            float(params["high_freq_factor"]),
            int(params["original_max_position_embeddings"]),
        )
    raise ConfigError(
        f"config key '{source}.rope_type' = {rope_type!r} is not supported (supported: default, linear, llama3)"
    )


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
