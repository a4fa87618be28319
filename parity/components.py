"""The parity trace's component names, in forward order, and where each one sits in depth.

Both backends record the same names (see torch_impl/decoder_layer.py and jax_impl/decoder_layer.py); this
module is the single list the comparison walks, so "the first component that diverges" means the first in
the order the forward pass computes them, not the first in a dict (JAX returns its trace sorted by name).
"""

from __future__ import annotations

# Per layer, in the order a layer computes them. attn.q / attn.k are after q/k norm and RoPE ([B, T, n, d]).
LAYER_COMPONENTS = (
    "input_norm",
    "attn.q",
    "attn.k",
    "attn_out",
    "x1",
    "post_attn_norm",
    "mlp.gate_up",
    "mlp.act",
    "mlp_out",
    "x2",
)
LOGITS = "logits"


def component_order(num_layers: int) -> list[str]:
    """Every traced component in forward order: embed, each layer's components, final_norm, logits."""
    names = ["embed"]
    for i in range(num_layers):
        names += [f"layers.{i}.{c}" for c in LAYER_COMPONENTS]
    return names + ["final_norm", LOGITS]


def layers_before(name: str, num_layers: int) -> int:
    """How many whole layers precede `name`: 0 for embed and layer 0, i for layer i, L for final_norm/logits.

    Tolerances grow with this depth (parity/tolerances.py): rounding discrepancies compound layer by layer.
    """
    if name.startswith("layers."):
        return int(name.split(".")[1])
    return 0 if name == "embed" else num_layers


def hf_components(num_layers: int) -> list[str]:
    """The components transformers exposes through `output_hidden_states` and its logits.

    hidden_states[0] is the embedding, hidden_states[i + 1] is x2 of layer i for i < L - 1, and the last
    entry is the final norm's output (transformers applies the norm before appending it), so x2 of the
    last layer is not exposed.
    """
    return ["embed"] + [f"layers.{i}.x2" for i in range(num_layers - 1)] + ["final_norm", LOGITS]


def residual_stream(num_layers: int) -> list[str]:
    """What --plot draws: x1 and x2 of every layer, then the logits."""
    names = []
    for i in range(num_layers):
        names += [f"layers.{i}.x1", f"layers.{i}.x2"]
    return names + [LOGITS]
