"""The mutant catalogue: bugs a port typically has, each injected into ONE backend for one test only.

Every mutant is applied through a `pytest.MonkeyPatch` (undone when the test ends) to module-level functions
the backends look up at call time, or to the model a backend's `from_pretrained` returns (the package
attribute is wrapped; parity/capture.py looks it up at call time). Nothing here is reachable from the
product. `expect` is the component the parity report must name as the first divergence; `why` says why
that component and not an earlier one.

JAX: `jax_impl.model.forward` is jitted with the graph static, so a patched function is only seen after
`jax.clear_caches()`; tests clear the caches before and after a JAX mutant (`Mutant.jax`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import pytest

import jax_impl
import kernels.pallas.reference as pallas_ref
import kernels.triton.reference as triton_ref
import torch_impl


@dataclass(frozen=True)
class Mutant:
    name: str
    backend: str  # "torch" | "jax": where it is injected
    expect: str  # the component the report must name first
    why: str
    inject: Callable[[pytest.MonkeyPatch], None]
    checkpoint: str = "default"  # "default" or "large_eps" (see tests/parity/conftest.py)

    @property
    def jax(self) -> bool:
        return self.backend == "jax"


# ---- helpers ------------------------------------------------------------------------------------------
def _patch_loaded(mp: pytest.MonkeyPatch, backend: ModuleType, change: Callable) -> None:
    """Wrap `backend.from_pretrained` (torch_impl or jax_impl) so that `change(model)` runs on every model it loads."""
    original = backend.from_pretrained

    def load(*args, **kwargs):
        model = original(*args, **kwargs)
        change(model)
        return model

    mp.setattr(backend, "from_pretrained", load)


def _torch_norm(variant: str) -> Callable[[pytest.MonkeyPatch], None]:
    """Replace torch's add_rms_norm reference with a wrong normalization (same dual-variable contract)."""
    import torch

    def norm(x, residual, weight, eps):
        if residual is not None:
            x = (x.float() + residual.float()).to(x.dtype)
        xf = x.float()
        if variant == "layernorm":  # subtracts the mean: LayerNorm without bias
            xf = xf - xf.mean(-1, keepdim=True)
            out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        else:  # "eps_outside_sqrt": x / (sqrt(mean(x^2)) + eps)
            out = xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + eps)
        out = weight * out.to(x.dtype)
        return out if residual is None else (out, x)

    return lambda mp: mp.setattr(triton_ref, "add_rms_norm_reference", norm)


def _torch_act(kind: str) -> Callable[[pytest.MonkeyPatch], None]:
    import torch.nn.functional as F

    def act(x):
        gate, up = x.float().chunk(2, dim=-1)
        out = {"relu": lambda: F.relu(gate) * up, "silu_only": lambda: F.silu(gate)}[kind]()
        return out.to(x.dtype)

    return lambda mp: mp.setattr(triton_ref, "silu_and_mul_reference", act)


def _jax_act(kind: str) -> Callable[[pytest.MonkeyPatch], None]:
    import jax
    import jax.numpy as jnp

    def act(x):
        gate, up = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        out = {"gelu": lambda: jax.nn.gelu(gate, approximate=False) * up, "no_silu": lambda: gate * up}[kind]()
        return out.astype(x.dtype)

    return lambda mp: mp.setattr(pallas_ref, "silu_and_mul_reference", act)


def _swap_gate_up(model) -> None:
    import torch

    for layer in model.model.layers:
        w = layer.mlp.gate_up_proj.weight
        half = w.shape[0] // 2
        w.copy_(torch.cat([w[half:], w[:half]]))  # checkpoint gate/up order opposite to the runtime split


def _untie_and_quantize_head(model) -> None:
    import torch

    embed = model.model.embed_tokens.weight
    model.lm_head.weight = torch.nn.Parameter(embed.detach().to(torch.bfloat16).to(embed.dtype), requires_grad=False)


def _final_norm_skips_increment(model) -> None:
    norm = model.model.norm
    original = norm.forward

    def forward(hidden, residual=None):
        if residual is None:
            return original(hidden)
        return original(residual), residual  # normalizes x1 + ... without the last MLP increment

    norm.forward = forward


def _rope_theta_ignored(model) -> None:
    import torch

    d = model.spec.head_dim
    model.model.rotary_emb.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))


def _skip_qk_norm_jax(model) -> None:
    for layer in model.model.layers:
        layer.self_attn.q_norm = None
        layer.self_attn.k_norm = None


def _rotate_interleaved_jax(x):
    import jax.numpy as jnp

    pairs = x.reshape(*x.shape[:-1], -1, 2)  # (2i, 2i+1) pairs: the GPT-J convention, not rotate-half
    return jnp.stack((-pairs[..., 1], pairs[..., 0]), axis=-1).reshape(x.shape)


def _group_heads_tiled(q, num_kv_heads):
    """The `repeat` (tile) mapping: query head h reads kv head h % n_kv, not h // groups."""
    b, t, n, d = q.shape
    return q.view(b, t, n // num_kv_heads, num_kv_heads, d).transpose(2, 3)  # [B, T, n_kv, g, d]


def _causal_mask_off_by_one(key_valid, q_start, q_len):
    import torch

    q_slot = q_start + torch.arange(q_len, device=key_valid.device)
    k_slot = torch.arange(key_valid.shape[1], device=key_valid.device)
    return (k_slot[None, :] <= q_slot[:, None] + 1)[None] & key_valid[:, None, :]  # sees one future token


# ---- the table ------------------------------------------------------------------------------------------
MUTANTS: list[Mutant] = [
    Mutant(
        "rmsnorm_as_layernorm",
        "torch",
        "layers.0.input_norm",
        "the first norm is the first op after the (exact) embedding gather",
        _torch_norm("layernorm"),
    ),
    Mutant(
        "gate_up_order_swapped",
        "torch",
        "layers.0.mlp.gate_up",
        "the merged projection's output halves trade places; everything before it is untouched",
        lambda mp: _patch_loaded(mp, torch_impl, _swap_gate_up),
    ),
    Mutant(
        "gelu_instead_of_silu",
        "jax",
        "layers.0.mlp.act",
        "the activation is the first op that uses it; gate_up is still right",
        _jax_act("gelu"),
    ),
    Mutant("relu_instead_of_silu", "torch", "layers.0.mlp.act", "as gelu", _torch_act("relu")),
    Mutant(
        "multiply_dropped_silu_gate_only",
        "torch",
        "layers.0.mlp.act",
        "act = silu(gate) ignores up: wrong from the activation on",
        _torch_act("silu_only"),
    ),
    Mutant(
        "silu_dropped_gate_times_up", "jax", "layers.0.mlp.act", "act = gate * up without SiLU", _jax_act("no_silu")
    ),
    Mutant(
        "tied_head_copied_and_quantized",
        "torch",
        "logits",
        "the embedding table itself is intact (embed matches); only the head's copy differs",
        lambda mp: _patch_loaded(mp, torch_impl, _untie_and_quantize_head),
    ),
    Mutant(
        "final_norm_misses_last_increment",
        "torch",
        "final_norm",
        "each layer's trace records x2 itself; only the final norm consumes the last increment",
        lambda mp: _patch_loaded(mp, torch_impl, _final_norm_skips_increment),
    ),
    Mutant(
        "eps_outside_sqrt",
        "torch",
        "layers.0.input_norm",
        "needs a visible eps: checkpoint with rms_norm_eps=0.1 (with 1e-6 the change is ~1e-6, below float32 "
        "noise of a correct model); the first norm is the first op it changes",
        _torch_norm("eps_outside_sqrt"),
        checkpoint="large_eps",
    ),
    Mutant(
        "rope_interleaved",
        "jax",
        "layers.0.attn.q",
        "q is traced after RoPE (q comes before k); positions > 0 are rotated differently",
        lambda mp: mp.setattr(jax_impl.rotary_embedding, "rotate_half", _rotate_interleaved_jax),
    ),
    Mutant(
        "gqa_repeat_not_interleave",
        "torch",
        "layers.0.attn_out",
        "q and k are traced before the heads are grouped; the attention output is the first to mix them "
        "(4 query heads on 2 kv heads: heads 1 and 2 read the wrong kv head)",
        lambda mp: mp.setattr(torch_impl.attention, "group_heads", _group_heads_tiled),
    ),
    Mutant(
        "qk_norm_skipped",
        "jax",
        "layers.0.attn.q",
        "q is normalized (then rotated) before it is traced",
        lambda mp: _patch_loaded(mp, jax_impl, _skip_qk_norm_jax),
    ),
    Mutant(
        "causal_mask_off_by_one",
        "torch",
        "layers.0.attn_out",
        "the mask does not touch q or k; the attention output is the first to see a future token",
        lambda mp: mp.setattr(torch_impl.model, "causal_mask", _causal_mask_off_by_one),
    ),
    Mutant(
        "rope_theta_ignored",
        "torch",
        "layers.0.attn.q",
        "theta 1e6 replaced by 10000 changes every rotation at positions > 0; q is traced after RoPE",
        lambda mp: _patch_loaded(mp, torch_impl, _rope_theta_ignored),
    ),
]
