"""The parameter table: the one place that says which tensors a checkpoint holds and how they pack.

Each row names a Hugging Face checkpoint tensor, its shape as the spec implies it (torch layout:
Linear weights are [out, in]), and the runtime parameter it lands in. Runtime parameters have the same
dotted path in both backends (`model.layers.0.mlp.gate_up_proj`); `role` says which attribute of that
module it is (`weight` or `bias`). Where several checkpoint tensors pack into one runtime parameter
(gate and up into `gate_up_proj`, gate first), `part` gives the order of concatenation along axis 0.

Both backends' loaders and the checkpoint validator derive from this table; neither backend hard-codes
checkpoint names of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from spec.config import ModelSpec

LINEAR, EMBEDDING, NORM, BIAS = "linear", "embedding", "norm", "bias"


@dataclass(frozen=True)
class ParamEntry:
    name: str  # checkpoint tensor name, e.g. "model.layers.0.self_attn.q_proj.weight"
    shape: tuple[int, ...]  # in the checkpoint, torch layout ([out, in] for a Linear)
    module: str  # runtime module path, identical in torch_impl and jax_impl
    role: str  # "weight" | "bias": which attribute of the runtime module
    kind: str  # LINEAR | EMBEDDING | NORM | BIAS: how a backend stores it (Flax transposes LINEAR)
    part: int = 0  # position in the concatenation along axis 0 when several tensors pack into one
    parts: int = 1  # how many tensors pack into this runtime parameter


def param_table(spec: ModelSpec) -> list[ParamEntry]:
    """Every tensor a checkpoint for `spec` must hold, in forward order.

    A tied checkpoint has no `lm_head.weight` row: the head is the embedding (see validate.py for a
    tied checkpoint that stores it anyway).
    """
    h, i, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    q_out = spec.num_attention_heads * spec.head_dim
    kv_out = spec.num_key_value_heads * spec.head_dim
    rows = [ParamEntry("model.embed_tokens.weight", (v, h), "model.embed_tokens", "weight", EMBEDDING)]
    for n in range(spec.num_hidden_layers):
        p = f"model.layers.{n}"
        rows.append(ParamEntry(f"{p}.input_layernorm.weight", (h,), f"{p}.input_layernorm", "weight", NORM))
        for proj, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            rows.append(ParamEntry(f"{p}.self_attn.{proj}.weight", (out, h), f"{p}.self_attn.{proj}", "weight", LINEAR))
            if spec.attention_bias:
                rows.append(ParamEntry(f"{p}.self_attn.{proj}.bias", (out,), f"{p}.self_attn.{proj}", "bias", BIAS))
        rows.append(ParamEntry(f"{p}.self_attn.o_proj.weight", (h, q_out), f"{p}.self_attn.o_proj", "weight", LINEAR))
        if spec.qk_norm:
            for norm in ("q_norm", "k_norm"):
                rows.append(
                    ParamEntry(
                        f"{p}.self_attn.{norm}.weight", (spec.head_dim,), f"{p}.self_attn.{norm}", "weight", NORM
                    )
                )
        rows.append(
            ParamEntry(f"{p}.post_attention_layernorm.weight", (h,), f"{p}.post_attention_layernorm", "weight", NORM)
        )
        # Gate first, then up: the runtime split takes the first half as the gate.
        rows.append(ParamEntry(f"{p}.mlp.gate_proj.weight", (i, h), f"{p}.mlp.gate_up_proj", "weight", LINEAR, 0, 2))
        rows.append(ParamEntry(f"{p}.mlp.up_proj.weight", (i, h), f"{p}.mlp.gate_up_proj", "weight", LINEAR, 1, 2))
        rows.append(ParamEntry(f"{p}.mlp.down_proj.weight", (h, i), f"{p}.mlp.down_proj", "weight", LINEAR))
    rows.append(ParamEntry("model.norm.weight", (h,), "model.norm", "weight", NORM))
    if not spec.tie_word_embeddings:
        rows.append(ParamEntry("lm_head.weight", (v, h), "lm_head", "weight", LINEAR))
    return rows


def runtime_groups(spec: ModelSpec) -> dict[tuple[str, str], list[ParamEntry]]:
    """(module, role) -> its checkpoint entries in concatenation order: what a loader iterates."""
    groups: dict[tuple[str, str], list[ParamEntry]] = {}
    for entry in param_table(spec):
        groups.setdefault((entry.module, entry.role), []).append(entry)
    for entries in groups.values():
        entries.sort(key=lambda e: e.part)
    return groups


def parameter_count(spec: ModelSpec) -> int:
    """Parameters the model holds (a tied head counts once)."""
    total = 0
    for entry in param_table(spec):
        count = 1
        for dim in entry.shape:
            count *= dim
        total += count
    return total
