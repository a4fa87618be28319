"""The parity trace's component names, in forward order, and where each one sits in depth.

Both backends record the same names (see torch_impl/decoder_layer.py and jax_impl/decoder_layer.py); this
module is the single list the comparison walks, so "the first component that diverges" means the first in
the order the forward pass computes them, not the first in a dict (JAX returns its trace sorted by name).
"""

from __future__ import annotations

from spec import DEFAULT_SPEC, ModelSpec

# Per layer, in the order a layer computes them, over every family (docs/design.md, "Model families"); a layer
# records those its structure has (`layer_components`). attn.q / attn.k are after q/k norm and RoPE
# ([B, T, n, d]). attn_post_norm / mlp_post_norm: the norm on an increment (sandwich and post-norm layers);
# post_attn_norm: the norm before the MLP (transformers' post_attention_layernorm in a pre-norm layer, Gemma's
# pre_feedforward_layernorm, GPT-NeoX's second LayerNorm); x1 does not exist in a parallel-residual layer.
# A sparse (mixture-of-experts) layer records the moe.* components in place of the dense MLP's (issue 18):
# router_logits [B, T, E], topk_ids [B, T, k], topk_weights [B, T, k], experts_out and, with a shared expert
# (Qwen2-MoE), shared_out [B, T, H]; mlp_out is the block's output in both kinds of layer.
LAYER_COMPONENTS = (
    "input_norm",
    "attn.q",
    "attn.k",
    "attn_out",
    "attn_post_norm",
    "x1",
    "post_attn_norm",
    "mlp.gate_up",
    "mlp.up",
    "mlp.act",
    "moe.router_logits",
    "moe.topk_ids",
    "moe.topk_weights",
    "moe.experts_out",
    "moe.shared_out",
    "mlp_out",
    "mlp_post_norm",
    "x2",
)
LOGITS = "logits"
_PLAIN = DEFAULT_SPEC  # a pre-norm RMSNorm/SwiGLU layer: what component_order lists without a spec
HEAD = "head"  # the logits before the final soft-cap (Gemma 2); `logits` is after it


MOE_COMPONENTS = tuple(c for c in LAYER_COMPONENTS if c.startswith("moe."))


def moe_components(spec: ModelSpec) -> tuple[str, ...]:
    """What a sparse layer of `spec` records in place of the dense MLP's components (shared_out: Qwen2-MoE)."""
    return tuple(c for c in MOE_COMPONENTS if c != "moe.shared_out" or spec.shared_expert_intermediate_size > 0)


def layer_components(spec: ModelSpec | None = None, layer: int | None = None) -> tuple[str, ...]:
    """The components layer `layer` of `spec` records, in forward order (None: the Llama/Qwen pre-norm layer).

    Without `layer`, a dense layer's (a mixture-of-experts model's dense layers among its sparse ones)."""
    if spec is None:
        spec = _PLAIN
    present = {"attn.q", "attn.k", "attn_out", "mlp_out", "x2"}
    if layer is not None and spec.is_sparse(layer):
        present |= set(moe_components(spec))
    else:
        present |= {"mlp.act", "mlp.gate_up" if spec.gated_mlp else "mlp.up"}
    if spec.pre_norm:
        present.add("input_norm")
    if spec.norm_placement != "post":
        present.add("post_attn_norm")
    if spec.norm_placement in ("sandwich", "post"):
        present |= {"attn_post_norm", "mlp_post_norm"}
    if not spec.parallel_residual:
        present.add("x1")
    return tuple(c for c in LAYER_COMPONENTS if c in present)


def head_components(spec: ModelSpec | None = None) -> list[str]:
    """After the last layer: the final norm, the soft-cap's input where there is one, the logits."""
    capped = spec is not None and spec.final_logit_softcapping is not None
    return ["final_norm", HEAD, LOGITS] if capped else ["final_norm", LOGITS]


def component_order(num_layers: int, spec: ModelSpec | None = None) -> list[str]:
    """Every traced component in forward order: embed, each layer's components, the head's.

    Without `spec`, the Llama/Qwen layer's components; with it, those that model's structure records."""
    names = ["embed"]
    for i in range(num_layers):
        names += [f"layers.{i}.{c}" for c in layer_components(spec, i)]
    return names + head_components(spec)


def forward_order(num_layers: int) -> dict[str, int]:
    """Rank of every component any family records, in forward order: what sorting results by position uses."""
    names = ["embed"] + [f"layers.{i}.{c}" for i in range(num_layers) for c in LAYER_COMPONENTS]
    return {name: k for k, name in enumerate(names + ["final_norm", HEAD, LOGITS])}


def layers_before(name: str, num_layers: int) -> int:
    """How many whole layers precede `name`: 0 for embed and layer 0, i for layer i, L for final_norm/logits.

    Tolerances grow with this depth (parity/tolerances.py): rounding discrepancies compound layer by layer.
    """
    if name.startswith("layers."):
        return int(name.split(".")[1])
    return 0 if name == "embed" else num_layers


def hf_components(num_layers: int, spec: ModelSpec | None = None) -> list[str]:
    """The components transformers exposes through `output_hidden_states` and its logits.

    hidden_states[0] is the embedding, hidden_states[i + 1] is x2 of layer i for i < L - 1, and the last
    entry is the final norm's output (transformers applies the norm before appending it), so x2 of the
    last layer is not exposed. A sparse layer of a mixture-of-experts `spec` adds what forward hooks on its
    router, experts and shared expert see (parity/hf_reference.py): the moe.* components and mlp_out.
    """
    names = ["embed"]
    for i in range(num_layers):
        if spec is not None and spec.is_sparse(i):
            names += [f"layers.{i}.{c}" for c in (*moe_components(spec), "mlp_out")]
        if i < num_layers - 1:
            names.append(f"layers.{i}.x2")
    return names + ["final_norm", LOGITS]


def residual_stream(num_layers: int) -> list[str]:
    """What --plot draws: x1 and x2 of every layer, then the logits."""
    names = []
    for i in range(num_layers):
        names += [f"layers.{i}.x1", f"layers.{i}.x2"]
    return names + [LOGITS]
