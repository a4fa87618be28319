"""The parameter table: the one place that says which tensors a checkpoint holds and how they pack.

Each row names a Hugging Face checkpoint tensor, its shape as the spec implies it (torch layout:
Linear weights are [out, in]), and the runtime parameter it lands in. Runtime parameters have the same
dotted path in both backends (`model.layers.0.mlp.gate_up_proj`); `role` says which attribute of that
module it is (`weight` or `bias`). Where several checkpoint tensors pack into one runtime parameter
(gate and up into `gate_up_proj`, gate first), `part` gives the order of concatenation along axis 0.

Both backends' loaders and the checkpoint validator derive from this table; neither backend hard-codes
checkpoint names of its own.

The table is also the partition table (docs/design.md, "The partition table"): `placement` says how tensor
parallelism splits each checkpoint tensor, and `units` into how many equal blocks its split axis falls (heads,
kv heads, intermediate features). spec/parallel.py turns that into the slice a rank reads; neither backend
switches on module names.
"""

from __future__ import annotations

from dataclasses import dataclass

from spec.config import ModelSpec

LINEAR, EMBEDDING, NORM, BIAS = "linear", "embedding", "norm", "bias"
# Tensor-parallel placements, in the checkpoint's torch layout ([out, in] for a Linear):
COLUMN = "column"  # output features (axis 0) split in `units` blocks: q/k/v, gate, up (and their biases)
ROW = "row"  # input features (axis 1) split; each rank's partial products are summed: o_proj, down_proj
VOCAB = "vocab"  # vocabulary rows (axis 0) split after padding to a multiple of the degree: embedding, head
REPLICATED = "replicated"  # every rank holds the whole tensor: norms


@dataclass(frozen=True)
class ParamEntry:
    name: str  # checkpoint tensor name, e.g. "model.layers.0.self_attn.q_proj.weight"
    shape: tuple[int, ...]  # in the checkpoint, torch layout ([out, in] for a Linear)
    module: str  # runtime module path, identical in torch_impl and jax_impl
    role: str  # "weight" | "bias": which attribute of the runtime module
    kind: str  # LINEAR | EMBEDDING | NORM | BIAS: how a backend stores it (Flax transposes LINEAR)
    part: int = 0  # position in the concatenation along axis 0 when several tensors pack into one
    parts: int = 1  # how many tensors pack into this runtime parameter
    placement: str = REPLICATED  # COLUMN | ROW | VOCAB | REPLICATED: how tensor parallelism splits it
    units: int = 1  # equal blocks along the split axis (heads, kv heads, features); a rank takes whole blocks


def param_table(spec: ModelSpec) -> list[ParamEntry]:
    """Every tensor a checkpoint for `spec` must hold, in forward order.

    A tied checkpoint has no `lm_head.weight` row: the head is the embedding (see validate.py for a
    tied checkpoint that stores it anyway).
    """
    h, i, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    n, n_kv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    rows = [ParamEntry("model.embed_tokens.weight", (v, h), "model.embed_tokens", "weight", EMBEDDING, placement=VOCAB)]
    for layer in range(spec.num_hidden_layers):
        p = f"model.layers.{layer}"
        rows.append(ParamEntry(f"{p}.input_layernorm.weight", (h,), f"{p}.input_layernorm", "weight", NORM))
        for proj, heads in (("q_proj", n), ("k_proj", n_kv), ("v_proj", n_kv)):
            module, split = f"{p}.self_attn.{proj}", dict(placement=COLUMN, units=heads)
            rows.append(ParamEntry(f"{module}.weight", (heads * d, h), module, "weight", LINEAR, **split))
            if spec.attention_bias:
                rows.append(ParamEntry(f"{module}.bias", (heads * d,), module, "bias", BIAS, **split))
        o_proj = f"{p}.self_attn.o_proj"
        rows.append(ParamEntry(f"{o_proj}.weight", (h, n * d), o_proj, "weight", LINEAR, placement=ROW, units=n))
        if spec.qk_norm:  # listed after o_proj (the checkpoint order random_weights draws in); applied before it
            for norm in ("q_norm", "k_norm"):
                rows.append(ParamEntry(f"{p}.self_attn.{norm}.weight", (d,), f"{p}.self_attn.{norm}", "weight", NORM))
        post = f"{p}.post_attention_layernorm"
        rows.append(ParamEntry(f"{post}.weight", (h,), post, "weight", NORM))
        # Gate first, then up: the runtime split takes the first half as the gate. Each part is split on its
        # own, so a rank's packed slice is [gate_r; up_r] and its local split stays right.
        gate_up, column = f"{p}.mlp.gate_up_proj", dict(placement=COLUMN, units=i)
        rows.append(ParamEntry(f"{p}.mlp.gate_proj.weight", (i, h), gate_up, "weight", LINEAR, 0, 2, **column))
        rows.append(ParamEntry(f"{p}.mlp.up_proj.weight", (i, h), gate_up, "weight", LINEAR, 1, 2, **column))
        down = f"{p}.mlp.down_proj"
        rows.append(ParamEntry(f"{down}.weight", (h, i), down, "weight", LINEAR, placement=ROW, units=i))
    rows.append(ParamEntry("model.norm.weight", (h,), "model.norm", "weight", NORM))
    if not spec.tie_word_embeddings:
        rows.append(ParamEntry("lm_head.weight", (v, h), "lm_head", "weight", LINEAR, placement=VOCAB))
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
