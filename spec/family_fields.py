"""The config-key readers and refusals that several families share, and the names they read into.

spec/families.py's per-family readers call these: the activation (`ACTIVATIONS`), a key whose only value in a
family is fixed, the global RoPE, the sliding window and the per-layer attention kinds (`FULL`, `SLIDING`,
which spec/families.py re-exports for the backends), and the keys that would change the Llama/Qwen decoder.
Each refusal names the key and its value (docs/design.md, "Model families").
"""

from __future__ import annotations

from typing import Any

from spec.errors import ConfigError
from spec.json_fields import Fields
from spec.rope import global_rope

FULL, SLIDING = "full_attention", "sliding_attention"
# transformers' activation names -> the spec's: each is one formula (the tanh GELU has two names)
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu": "gelu",
}


def activation(fields: Fields, key: str, default: str, allowed: tuple[str, ...]) -> str:
    name = fields.string(key, default)
    act = ACTIVATIONS.get(name)
    if act not in allowed:
        names = sorted(k for k, v in ACTIVATIONS.items() if v in allowed)
        raise ConfigError(f"config key {key!r} = {name!r} is not supported for this family (supported: {names})")
    return act


def refuse_key(fields: Fields, key: str, ok: bool | None, what: str) -> None:
    """Refuse `key` unless it is absent or equals `ok` (the only value this family's structure has); a boolean
    key is type-checked first, so `1` is named as not a boolean rather than as an unsupported value."""
    value = fields.boolean(key, ok) if isinstance(ok, bool) else fields.value(key)
    if value is not None and value != ok:
        raise ConfigError(f"config key {key!r} = {fields.value(key)!r} is not supported for this family ({what})")


def rope_fields(fields: Fields, theta_key: str = "rope_theta") -> dict[str, Any]:
    theta, scaling, _ = global_rope(fields, theta_key)
    return {"rope_theta": theta, "rope_scaling": scaling}


def sliding_window(fields: Fields, default: int) -> int | None:
    """`sliding_window` as transformers reads it: absent -> the family's default, null -> no window."""
    if "sliding_window" not in fields.obj:
        return default
    return fields.integer("sliding_window", None)


def layer_types(fields: Fields, num_layers: int, default: list[str], window: int | None) -> tuple[str, ...]:
    """Per-layer attention kinds: the config's `layer_types` list, else the family's default pattern."""
    types = fields.strings("layer_types")
    if types is None:
        types = default
    elif len(types) != num_layers:
        raise ConfigError(f"config key 'layer_types' has {len(types)} entries but num_hidden_layers = {num_layers}")
    bad = sorted({t for t in types if t not in (FULL, SLIDING)})
    if bad:
        raise ConfigError(f"config key 'layer_types' contains {bad}: only {FULL!r} and {SLIDING!r} are supported")
    if SLIDING in types and window is None:
        raise ConfigError("config key 'layer_types' names sliding_attention layers but 'sliding_window' is null")
    return tuple(types) if SLIDING in types else ()


def plain_decoder(fields: Fields) -> None:
    """Keys that would change the Llama/Qwen structure; refused where that family's config has them set."""
    activation(fields, "hidden_act", "silu", ("silu",))
    refuse_key(fields, "mlp_bias", False, "SwiGLU without bias")
    for key in ("parallel_residual", "use_parallel_residual"):
        refuse_key(fields, key, False, "sequential residual only")
    partial = fields.number("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise ConfigError(f"config key 'partial_rotary_factor' = {partial!r} is not supported (full rotary only)")
    if fields.value("layer_norm_eps") is not None and fields.value("rms_norm_eps") is None:
        raise ConfigError(
            f"config key 'layer_norm_eps' = {fields.value('layer_norm_eps')!r}: LayerNorm is not supported "
            "for this family (RMSNorm only)"
        )
