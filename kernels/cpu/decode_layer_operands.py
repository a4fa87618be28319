"""What kernels/cpu/decode_layer.c computes and reads, framework-neutral: `computes`, the layers it stands for;
`LayerWeights`, one layer's parameters as the kernel reads them; `expected` and `mismatch`, the shape and kind of
every operand, which both launchers (torch_decode_layer.py, jax_decode_layer.py) check before a call so that an
error names the tensor."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from spec import ModelSpec


def computes(spec: ModelSpec, layer_idx: int) -> bool:
    """Whether the kernel computes layer `layer_idx` of `spec`: a dense pre-norm layer (not sandwich, no experts) with
    RMSNorm, a SiLU-gated MLP, separate q/k/v projections, per-head or no q/k norms and full attention (a sliding
    layer keeps its ring and its operators). The backends add their own conditions (reference kernels, no tensor
    parallelism)."""
    return (
        spec.norm_placement == "pre"
        and not spec.parallel_residual
        and not spec.is_sparse(layer_idx)
        and spec.norm_type == "rms"
        and spec.gated_mlp
        and spec.hidden_act == "silu"
        and not spec.fused_qkv
        and (not spec.qk_norm or spec.qk_norm_scope == "head")
        and spec.window(layer_idx) is None
    )


@dataclass(frozen=True)
class LayerWeights:
    """One layer's parameters (torch tensors or JAX arrays): the six products in the backend's layout (torch [out,
    in], Flax [in, out]) in the activations' dtype, biases [out] or None, norms [dim]; q_norm and k_norm [head_dim]
    (per head), or both None (no q/k norm)."""

    input_norm: Any
    post_norm: Any
    q_norm: Any | None
    k_norm: Any | None
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    wgu: Any
    wd: Any
    bq: Any | None = None
    bk: Any | None = None
    bv: Any | None = None
    bo: Any | None = None
    bgu: Any | None = None
    bd: Any | None = None


BIASES = ("bq", "bk", "bv", "bo", "bgu", "bd")


def expected(
    residual: Any | None, w: LayerWeights, cos: Any, sin: Any, k_cache: Any, v_cache: Any, mask: Any, *, rows: int,
    hidden: int, heads: int, mask_keys: int, cols: bool,
) -> list[tuple[str, Any, tuple[int, ...], str, bool]]:  # fmt: skip
    """(name, operand, its shape, its kind, may be None) for every operand of a layer over x [rows, 1, hidden] but x
    and the slot written, the sizes read from k_cache [B, n_kv, S, d], wd and cos; kind "act" (the activations'
    dtype), "float32" or "bool". Biases are "act": a launcher widens them to float32 for the kernel. `cols`: the
    products are [in, out] (Flax), else [out, in] (torch)."""
    _, kv_heads, slots, d = k_cache.shape  # the launchers check its rank first
    inter = (w.wd.shape[0 if cols else 1]) if len(w.wd.shape) == 2 else -1
    b, qk, kvd, r = rows, heads * d, kv_heads * d, cos.shape[-1]

    def product(name: str, out: int, inp: int) -> tuple:
        return name, getattr(w, name), ((inp, out) if cols else (out, inp)), "act", False

    return [
        ("residual", residual, (b, 1, hidden), "act", True),
        ("input_norm", w.input_norm, (hidden,), "act", False),
        ("post_norm", w.post_norm, (hidden,), "act", False),
        ("q_norm", w.q_norm, (d,), "act", True),
        ("k_norm", w.k_norm, (d,), "act", True),
        product("wq", qk, hidden), product("wk", kvd, hidden), product("wv", kvd, hidden),
        product("wo", hidden, qk), product("wgu", 2 * inter, hidden), product("wd", hidden, inter),
        *[(name, getattr(w, name), (out,), "act", True) for name, out in zip(
            BIASES, (qk, kvd, kvd, hidden, 2 * inter, hidden), strict=True)],
        ("k_cache", k_cache, (b, kv_heads, slots, d), "act", False),
        ("v_cache", v_cache, (b, kv_heads, d, slots), "act", False),
        ("cos", cos, (b, 1, r), "float32", False),
        ("sin", sin, (b, 1, r), "float32", False),
        ("mask", mask, (b, 1, mask_keys), "bool", False),
    ]  # fmt: skip


def structure_problem(w: LayerWeights, heads: int, k_cache_shape: tuple[int, ...], rotated: int) -> str | None:
    """What the operands' shapes alone cannot say: heads over kv heads, q/k norms together, the rotary width."""
    _, kv_heads, _, d = k_cache_shape
    if kv_heads <= 0 or heads % kv_heads:
        return f"{heads} heads over {kv_heads} kv heads: heads must be a multiple"
    if (w.q_norm is None) != (w.k_norm is None):
        return "q_norm and k_norm come together (per-head q/k norms) or not at all"
    if rotated % 2 or rotated > d:
        return f"cos and sin [B, 1, r] need r even and r <= head_dim {d}; got r = {rotated}"
    return None


def mismatch(
    operands: Iterable[tuple[str, Any, tuple[int, ...], str, bool]], kinds: dict[str, Any], fits: Callable[..., bool],
    where: str = "",
) -> str | None:  # fmt: skip
    """The first of `expected`'s operands that is missing or does not fit (`fits(operand, shape, dtype)`, the
    launcher's test), as a message naming it; None where all fit. `kinds` maps a kind to the launcher's dtype;
    `where` ends the requirement (" on the CPU")."""
    for name, operand, shape, kind, optional in operands:
        if operand is None:
            if optional:
                continue
            return f"{name} is required"
        if not fits(operand, shape, kinds[kind]):
            return f"{name} must be {list(shape)} {kinds[kind]}{where}; got {tuple(operand.shape)} {operand.dtype}"
    return None
