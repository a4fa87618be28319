"""The parameter table: the one place that says which tensors a checkpoint holds and how they pack.

Each row names a Hugging Face checkpoint tensor, its shape as the spec implies it (torch layout:
Linear weights are [out, in]), and the runtime parameter it lands in. Runtime parameters have the same
dotted path in both backends (`model.layers.0.mlp.gate_up_proj`); `role` says which attribute of that
module it is (`weight` or `bias`). Where several checkpoint tensors pack into one runtime parameter
(gate and up into `gate_up_proj`, gate first), `part` gives the order of concatenation along axis 0. A
mixture-of-experts layer stacks its experts: `expert` is the index along a new leading axis, so the runtime
`experts.gate_up_proj` is [E, 2I, H] in torch layout, packed from E per-expert gate_proj/up_proj tensors.

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
    expert: int | None = None  # index along the stacked leading [E] axis of an experts parameter; None: not stacked


def param_table(spec: ModelSpec) -> list[ParamEntry]:
    """Every tensor a checkpoint for `spec` must hold, in forward order.

    A tied checkpoint has no head row: the head is the embedding (see validate.py for a tied checkpoint
    that stores it anyway). Checkpoint names follow the family (GPT-NeoX: `gpt_neox.layers.N.attention.
    query_key_value`); runtime modules are the same for every family, named after the role they play.
    """
    names = _NEOX_NAMES if spec.model_type == "gpt_neox" else _NAMES
    h, i, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    n, n_kv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    norm_roles = ("weight", "bias") if spec.norm_type == "layer" else ("weight",)

    def norm(checkpoint: str, module: str, size: int, **split) -> list[ParamEntry]:
        return [ParamEntry(f"{checkpoint}.{role}", (size,), module, role, NORM, **split) for role in norm_roles]

    rows = [ParamEntry(f"{names['embed']}.weight", (v, h), "model.embed_tokens", "weight", EMBEDDING, placement=VOCAB)]
    for layer in range(spec.num_hidden_layers):
        p, c = f"model.layers.{layer}", names["layer"].format(layer)  # runtime, checkpoint prefixes
        if spec.pre_norm:
            rows += norm(f"{c}.input_layernorm", f"{p}.input_layernorm", h)
        if spec.fused_qkv:  # rows laid out per head, [n, 3, d]: a rank's whole heads are one contiguous block
            module, split = f"{p}.self_attn.qkv_proj", dict(placement=COLUMN, units=n)
            rows.append(ParamEntry(f"{c}.{names['qkv']}.weight", (3 * n * d, h), module, "weight", LINEAR, **split))
            if spec.attention_bias:
                rows.append(ParamEntry(f"{c}.{names['qkv']}.bias", (3 * n * d,), module, "bias", BIAS, **split))
        else:
            for proj, heads in (("q_proj", n), ("k_proj", n_kv), ("v_proj", n_kv)):
                module, split = f"{p}.self_attn.{proj}", dict(placement=COLUMN, units=heads)
                rows.append(
                    ParamEntry(f"{c}.self_attn.{proj}.weight", (heads * d, h), module, "weight", LINEAR, **split)
                )
                if spec.attention_bias:
                    rows.append(ParamEntry(f"{c}.self_attn.{proj}.bias", (heads * d,), module, "bias", BIAS, **split))
        o_proj, o_name = f"{p}.self_attn.o_proj", f"{c}.{names['o_proj']}"
        rows.append(ParamEntry(f"{o_name}.weight", (h, n * d), o_proj, "weight", LINEAR, placement=ROW, units=n))
        if spec.o_proj_bias:  # added once, after the row-parallel sum
            rows.append(ParamEntry(f"{o_name}.bias", (h,), o_proj, "bias", BIAS))
        if spec.qk_norm:  # listed after o_proj (the checkpoint order random_weights draws in); applied before it
            for qk, heads in (("q_norm", n), ("k_norm", n_kv)):
                module = f"{p}.self_attn.{qk}"
                if spec.qk_norm_scope == "head":  # one [d] weight shared by every head
                    rows += norm(f"{c}.self_attn.{qk}", module, d)
                else:  # over the whole projection (OLMo 2): split with the heads
                    rows += norm(f"{c}.self_attn.{qk}", module, heads * d, placement=COLUMN, units=heads)
        rows += norm(f"{c}.post_attention_layernorm", f"{p}.post_attention_layernorm", h)
        if spec.norm_placement == "sandwich":
            rows += norm(f"{c}.pre_feedforward_layernorm", f"{p}.pre_feedforward_layernorm", h)
        column = dict(placement=COLUMN, units=i)
        if spec.is_sparse(layer):
            rows += _moe_rows(spec, c, f"{p}.mlp")
        elif spec.gated_mlp:
            # Gate first, then up: the runtime split takes the first half as the gate. Each part is split on its
            # own, so a rank's packed slice is [gate_r; up_r] and its local split stays right.
            gate_up = f"{p}.mlp.gate_up_proj"
            rows.append(ParamEntry(f"{c}.mlp.gate_proj.weight", (i, h), gate_up, "weight", LINEAR, 0, 2, **column))
            rows.append(ParamEntry(f"{c}.mlp.up_proj.weight", (i, h), gate_up, "weight", LINEAR, 1, 2, **column))
            if spec.mlp_bias:
                rows.append(ParamEntry(f"{c}.mlp.gate_proj.bias", (i,), gate_up, "bias", BIAS, 0, 2, **column))
                rows.append(ParamEntry(f"{c}.mlp.up_proj.bias", (i,), gate_up, "bias", BIAS, 1, 2, **column))
        else:
            up, up_name = f"{p}.mlp.up_proj", f"{c}.{names['up']}"
            rows.append(ParamEntry(f"{up_name}.weight", (i, h), up, "weight", LINEAR, **column))
            if spec.mlp_bias:
                rows.append(ParamEntry(f"{up_name}.bias", (i,), up, "bias", BIAS, **column))
        if not spec.is_sparse(layer):
            down, down_name = f"{p}.mlp.down_proj", f"{c}.{names['down']}"
            rows.append(ParamEntry(f"{down_name}.weight", (h, i), down, "weight", LINEAR, placement=ROW, units=i))
            if spec.mlp_bias:  # added once, after the row-parallel sum
                rows.append(ParamEntry(f"{down_name}.bias", (h,), down, "bias", BIAS))
        if spec.norm_placement in ("sandwich", "post"):
            rows += norm(f"{c}.post_feedforward_layernorm", f"{p}.post_feedforward_layernorm", h)
    rows += norm(names["final_norm"], "model.norm", h)
    if not spec.tie_word_embeddings:
        rows.append(ParamEntry(f"{names['head']}.weight", (v, h), "lm_head", "weight", LINEAR, placement=VOCAB))
    return rows


def _moe_rows(spec: ModelSpec, c: str, p: str) -> list[ParamEntry]:
    """A sparse layer's tensors: the router, each expert's gate/up/down stacked along [E], the shared expert.

    `c` is the checkpoint's layer prefix, `p` the runtime MLP module. Each expert's tensors are split for tensor
    parallelism like a dense MLP's (over the expert's intermediate features); the router and the shared expert's
    sigmoid gate (one output) are replicated.
    """
    h, mi, si = spec.hidden_size, spec.moe_intermediate_size, spec.shared_expert_intermediate_size
    moe, (gate, up, down) = (
        ("block_sparse_moe", ("w1", "w3", "w2")) if spec.model_type == "mixtral" else ("mlp", _GATE_UP_DOWN)
    )
    rows = [ParamEntry(f"{c}.{moe}.gate.weight", (spec.num_experts, h), f"{p}.router", "weight", LINEAR)]
    column, row = dict(placement=COLUMN, units=mi), dict(placement=ROW, units=mi)
    for e in range(spec.num_experts):
        x = f"{c}.{moe}.experts.{e}"
        gate_up, down_proj = f"{p}.experts.gate_up_proj", f"{p}.experts.down_proj"
        rows.append(ParamEntry(f"{x}.{gate}.weight", (mi, h), gate_up, "weight", LINEAR, 0, 2, **column, expert=e))
        rows.append(ParamEntry(f"{x}.{up}.weight", (mi, h), gate_up, "weight", LINEAR, 1, 2, **column, expert=e))
        rows.append(ParamEntry(f"{x}.{down}.weight", (h, mi), down_proj, "weight", LINEAR, **row, expert=e))
    if si:
        x, column, row = f"{c}.mlp.shared_expert", dict(placement=COLUMN, units=si), dict(placement=ROW, units=si)
        gate_up = f"{p}.shared_expert.gate_up_proj"
        rows.append(ParamEntry(f"{x}.gate_proj.weight", (si, h), gate_up, "weight", LINEAR, 0, 2, **column))
        rows.append(ParamEntry(f"{x}.up_proj.weight", (si, h), gate_up, "weight", LINEAR, 1, 2, **column))
        down_proj, shared_gate = f"{p}.shared_expert.down_proj", f"{p}.shared_expert_gate"
        rows.append(ParamEntry(f"{x}.down_proj.weight", (h, si), down_proj, "weight", LINEAR, **row))
        rows.append(ParamEntry(f"{c}.mlp.shared_expert_gate.weight", (1, h), shared_gate, "weight", LINEAR))
    return rows


_GATE_UP_DOWN = ("gate_proj", "up_proj", "down_proj")
# Checkpoint names of the tensors whose names differ between families; the rest are the Llama names.
_NAMES = {
    "embed": "model.embed_tokens",
    "layer": "model.layers.{}",
    "o_proj": "self_attn.o_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
    "final_norm": "model.norm",
    "head": "lm_head",
}
_NEOX_NAMES = {
    "embed": "gpt_neox.embed_in",
    "layer": "gpt_neox.layers.{}",
    "qkv": "attention.query_key_value",
    "o_proj": "attention.dense",
    "up": "mlp.dense_h_to_4h",
    "down": "mlp.dense_4h_to_h",
    "final_norm": "gpt_neox.final_layer_norm",
    "head": "embed_out",
}


def runtime_groups(spec: ModelSpec) -> dict[tuple[str, str], list[ParamEntry]]:
    """(module, role) -> its checkpoint entries in packing order (expert, then part): what a loader iterates."""
    groups: dict[tuple[str, str], list[ParamEntry]] = {}
    for entry in param_table(spec):
        groups.setdefault((entry.module, entry.role), []).append(entry)
    for entries in groups.values():
        entries.sort(key=lambda e: (-1 if e.expert is None else e.expert, e.part))
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
