"""Rotary position embedding parameters: the scaling types the spec knows and the inverse frequencies.

Both config forms transformers has shipped are read here: the older top-level `rope_theta` / `rope_scaling`
and the newer `rope_parameters` (which Gemma 3 also nests per layer type: `full_attention` /
`sliding_attention`). `rope_inv_freq` is the one computation both backends take their frequencies from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spec.errors import ConfigError
from spec.json_fields import Fields

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: `linear` (positions / factor) or `llama3` (banded, Llama 3.1)."""

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None


def parse_rope(params: Fields, theta_default: float) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from one rope dict (`rope_parameters`, a per-layer-type entry of it, or `rope_scaling`)."""
    theta = params.number("rope_theta", theta_default)
    rope_type = params.string("rope_type", None) or params.string("type", "default")
    if rope_type == "default":
        return theta, None
    if rope_type not in ROPE_TYPES:
        raise ConfigError(
            f"config key '{params.prefix}rope_type' = {rope_type!r} is not supported "
            f"(supported: {', '.join(ROPE_TYPES)})"
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


def global_rope(fields: Fields, theta_key: str = "rope_theta") -> tuple[float, RopeScaling | None, Fields | None]:
    """(theta, scaling, rope_parameters) of a config with one RoPE for every layer, from either form;
    `rope_parameters` wins where both are present. `theta_key` is the older form's top-level key."""
    params = fields.nested("rope_parameters")
    theta_default = fields.number(theta_key, 10000.0)
    if params is None:
        scaling = fields.nested("rope_scaling") or Fields({}, ConfigError, prefix="rope_scaling.")
        return (*parse_rope(scaling, theta_default), None)
    return (*parse_rope(params, theta_default), params)


def rope_inv_freq(dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """Inverse frequencies theta^(-2i/dim) [dim // 2], then the scaling, as Hugging Face computes them.

    `dim` is the rotated width of a head (all of it, or the partial-rotary part). Computed in float64 and
    rounded once to float32, so both backends start from identical bits.
    """
    inv = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))  # [dim/2]
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
