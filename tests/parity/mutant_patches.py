"""The patch functions of the mutant catalogue (tests/parity/mutants.py): each makes one bug a port typically has.

They are injected through a `pytest.MonkeyPatch` (undone when the test ends), into module-level functions the
backends look up at call time or into the model a backend's `from_pretrained` returns (`patch_loaded`). Also used
by tests/parity/grad_mutants.py, tests/parity/test_moe_mutants.py and tests/parity/test_cli.py. Nothing here is
reachable from the product.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

import jax_impl
import kernels.pallas.reference as pallas_ref
import kernels.triton.reference as triton_ref
import torch_impl


# ---- helpers ------------------------------------------------------------------------------------------
def patch_loaded(mp: pytest.MonkeyPatch, backend: ModuleType, change: Callable) -> None:
    """Wrap `backend.from_pretrained` (torch_impl or jax_impl) so that `change(model)` runs on every model it loads."""
    original = backend.from_pretrained

    def load(*args, **kwargs):
        model = original(*args, **kwargs)
        change(model)
        return model

    mp.setattr(backend, "from_pretrained", load)


def torch_norm(variant: str) -> Callable[[pytest.MonkeyPatch], None]:
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


def torch_act(kind: str) -> Callable[[pytest.MonkeyPatch], None]:
    import torch.nn.functional as F

    def act(x):
        gate, up = x.float().chunk(2, dim=-1)
        out = {"relu": lambda: F.relu(gate) * up, "silu_only": lambda: F.silu(gate)}[kind]()
        return out.to(x.dtype)

    return lambda mp: mp.setattr(triton_ref, "silu_and_mul_reference", act)


def jax_act(kind: str) -> Callable[[pytest.MonkeyPatch], None]:
    import jax
    import jax.numpy as jnp

    def act(x):
        gate, up = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        out = {"gelu": lambda: jax.nn.gelu(gate, approximate=False) * up, "no_silu": lambda: gate * up}[kind]()
        return out.astype(x.dtype)

    return lambda mp: mp.setattr(pallas_ref, "silu_and_mul_reference", act)


def swap_gate_up(model) -> None:
    import torch

    for layer in model.model.layers:
        w = layer.mlp.gate_up_proj.weight
        half = w.shape[0] // 2
        w.copy_(torch.cat([w[half:], w[:half]]))  # checkpoint gate/up order opposite to the runtime split


def untie_and_quantize_head(model) -> None:
    import torch

    embed = model.model.embed_tokens.weight
    model.lm_head.weight = torch.nn.Parameter(embed.detach().to(torch.bfloat16).to(embed.dtype), requires_grad=False)


def final_norm_skips_increment(model) -> None:
    norm = model.model.norm
    original = norm.forward

    def forward(hidden, residual=None):
        if residual is None:
            return original(hidden)
        return original(residual), residual  # normalizes x1 + ... without the last MLP increment

    norm.forward = forward


def rope_theta_ignored(model) -> None:
    import torch

    d = model.spec.head_dim
    model.model.rotary_emb.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))


def skip_qk_norm_jax(model) -> None:
    for layer in model.model.layers:
        layer.self_attn.q_norm = None
        layer.self_attn.k_norm = None


def rotate_interleaved_jax(x):
    import jax.numpy as jnp

    pairs = x.reshape(*x.shape[:-1], -1, 2)  # (2i, 2i+1) pairs: the GPT-J convention, not rotate-half
    return jnp.stack((-pairs[..., 1], pairs[..., 0]), axis=-1).reshape(x.shape)


def group_heads_tiled(q, num_kv_heads):
    """The `repeat` (tile) mapping: query head h reads kv head h % n_kv, not h // groups."""
    b, t, n, d = q.shape
    return q.view(b, t, n // num_kv_heads, num_kv_heads, d).transpose(2, 3)  # [B, T, n_kv, g, d]


def causal_mask_off_by_one(key_valid, q_start, q_len):
    import torch

    q_slot = q_start + torch.arange(q_len, device=key_valid.device)
    k_slot = torch.arange(key_valid.shape[1], device=key_valid.device)
    return (k_slot[None, :] <= q_slot[:, None] + 1)[None] & key_valid[:, None, :]  # sees one future token


# ---- issue 15: the model families' porting bugs -----------------------------------------------------------
def _norm_options(*, offset: bool = True, float32_weight: bool = True) -> Callable:
    """The framework's add_rms_norm reference with one of the family options dropped at every call."""

    def wrap(original):
        def norm(x, residual, weight, eps, **options):
            if not offset:
                options.pop("offset", None)  # Gemma's (1 + w) applied as w
            if not float32_weight:
                options.pop("float32_weight", None)  # the weight multiply after the cast, in the activation dtype
            return original(x, residual, weight, eps, **options)

        return norm

    return wrap


def patch_norm(framework: ModuleType, **dropped: bool) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda mp: mp.setattr(
        framework, "add_rms_norm_reference", _norm_options(**dropped)(framework.add_rms_norm_reference)
    )


def embedding_scale_float32(spec, dtype):
    """sqrt(hidden) as a Python float: torch multiplies a bf16 tensor by it in float32 (55.4256, not bf16's 55.5
    at H = 3072) and rounds the product once."""
    return spec.hidden_size**0.5


def gelu_erf_and_mul_jax(x):
    import jax
    import jax.numpy as jnp

    gate, up = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return (jax.nn.gelu(gate, approximate=False) * up).astype(x.dtype)  # exact erf where Gemma's is tanh


def attend_without_softcap(mp: pytest.MonkeyPatch) -> None:
    original = torch_impl.attention.attend

    def attend(q, k, v, mask, scale, softcap=None):
        return original(q, k, v, mask, scale)  # attn_logit_softcapping read from the config but never applied

    mp.setattr(torch_impl.attention, "attend", attend)


def window_off_by_one_jax(mp: pytest.MonkeyPatch) -> None:
    original = jax_impl.model.causal_mask

    def causal_mask(key_valid, q_start, q_len, window=None, k_slot=None):
        # k >= q - window instead of k > q - window: each query sees window + 1 keys
        return original(key_valid, q_start, q_len, None if window is None else window + 1, k_slot)

    mp.setattr(jax_impl.model, "causal_mask", causal_mask)


def local_rope_scaled(model) -> None:
    """Gemma 3: the global layers' RoPE scaling (linear, factor 8) applied to the sliding layers' table too."""
    import torch

    from spec import rope_inv_freq

    s = model.spec
    scaled = rope_inv_freq(s.rotary_dim, s.local_rope_theta, s.rope_scaling)
    model.model.rotary_emb_local.inv_freq = torch.from_numpy(scaled)


def olmo2_qk_norm_per_head(mp: pytest.MonkeyPatch) -> None:
    """OLMo 2's q/k norm taken over each head's d (Qwen3's scope) with the projection-wide weight viewed [n, d]."""
    import torch

    def per_head(norm, x, heads):
        b, t, _ = x.shape
        xf = x.float().view(b, t, heads, -1)  # [B, T, n, d]
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)
        return (normed * norm.weight.float().view(heads, -1)).to(x.dtype).view(b, t, -1)

    def project(self, x):
        b, t, _ = x.shape
        n, n_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k = per_head(self.q_norm, q, n), per_head(self.k_norm, k, n_kv)
        return q.view(b, t, n, d), k.view(b, t, n_kv, d), v.view(b, t, n_kv, d)

    mp.setattr(torch_impl.attention.Attention, "_project", project)


def parallel_residual_sequential(mp: pytest.MonkeyPatch) -> None:
    """GPT-NeoX with use_parallel_residual=True run as the sequential layer: the MLP's norm reads x + attn."""

    def forward(self, hidden, residual, cos, sin, mask, cache=None, trace=None):
        name = f"layers.{self.layer_idx}"
        attn_in = self.input_layernorm(hidden)
        attn = self.self_attn(attn_in, cos, sin, mask, cache, trace)
        x1 = hidden + attn
        mlp_in = self.post_attention_layernorm(x1)
        mlp = self.mlp(mlp_in, trace)
        x2 = x1 + mlp
        if trace is not None:
            trace.update({f"{name}.input_norm": attn_in, f"{name}.attn_out": attn})
            trace.update({f"{name}.post_attn_norm": mlp_in, f"{name}.mlp_out": mlp, f"{name}.x2": x2})
        return x2, None

    mp.setattr(torch_impl.decoder_layer_plain.ParallelDecoderLayer, "forward", forward)


def rotary_full_head_jax(mp: pytest.MonkeyPatch) -> None:
    """GPT-NeoX's rotary_pct ignored: frequencies over the whole head_dim, so apply_rotary rotates every dim."""
    import jax.numpy as jnp

    from spec import rope_inv_freq

    def rope(self, positions):
        s = self.spec
        inv_freq = jnp.asarray(rope_inv_freq(s.head_dim, s.rope_theta, s.rope_scaling))  # [d/2], not [r/2]
        freqs = positions.astype(jnp.float32)[..., None] * inv_freq
        angles = jnp.concatenate((freqs, freqs), axis=-1)
        return jnp.cos(angles), jnp.sin(angles)

    mp.setattr(jax_impl.rotary_embedding.RotaryEmbedding, "__call__", rope)
