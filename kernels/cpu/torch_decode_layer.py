"""PyTorch launcher of a whole pre-norm decoder layer of a CPU decode step in one call (kernels/cpu/decode_layer.c).

torch_impl/decoder_layer.py's DecoderLayer runs a dense layer's decode step through `decode_layer` where every one
of its products took the few-row kernel (kernels/cpu/torch_gemv.py) and its small operators would run as
kernels/cpu/torch_decode_ops.py's calls: the same functions in the same order, so the result is the per-operator
layer's, bit for bit (the tests hold it to that), at one call instead of ~30. Operands are checked here, so a
direct caller gets an error naming the tensor; the layer passes its own parameters and cache. Called through ctypes
on the tensors' memory; the layer's OpenMP region is torch's own team (the library is loaded after torch, as
torch_gemv.py's is).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools

import torch

from kernels.cpu import build, decode_layer_operands
from kernels.cpu.decode_layer_operands import LayerWeights
from kernels.cpu.switch import Switch

_L, _F, _I, _P = ctypes.c_long, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
_LONGS = ("rows", "hidden", "heads", "kv_heads", "head_dim", "rotated", "inter", "pos", "mask_row")
_STRIDES = ("k_batch", "k_head", "v_batch", "v_head", "v_row")
_POINTERS = (
    "x", "residual", "input_norm", "post_norm", "q_norm", "k_norm", "wq", "wk", "wv", "wo", "wgu", "wd",
    "bq", "bk", "bv", "bo", "bgu", "bd", "cos", "sin", "k_cache", "v_cache", "mask", "out", "residual_out",
)  # fmt: skip


_OFF = Switch("torch_decode_layer.off")


def per_operator() -> contextlib.AbstractContextManager[None]:
    """Within the block (this thread) the layers keep their per-operator decode step: the tests' and the benchmark's
    side-by-side runs."""
    return _OFF.on()


def enabled() -> bool:
    """Outside `per_operator()`, and the kernel built here."""
    return not _OFF.get() and available()


class _DecodeLayer(ctypes.Structure):
    """decode_layer.h's DecodeLayer, field for field."""

    _fields_ = [
        *[(name, _L) for name in (*_LONGS, *_STRIDES)],
        *[(name, _F) for name in ("eps", "offset", "scale", "cap")],
        *[(name, _I) for name in ("float32_weight", "cols")],
        *[(name, _P) for name in _POINTERS],
    ]


@functools.cache
def _functions() -> dict[torch.dtype, ctypes._CFuncPtr] | None:
    argtypes = [ctypes.POINTER(_DecodeLayer)]
    return build.functions(
        "decode_layer", {torch.float32: ("decode_layer_f32", argtypes), torch.bfloat16: ("decode_layer_bf16", argtypes)}
    )


def available() -> bool:
    """Whether the kernel runs here (kernels.cpu.build.unavailable("decode_layer"): why not)."""
    return _functions() is not None


def _refuse(problem: str) -> ValueError:
    return ValueError(f"kernels.cpu decode_layer: {problem}")


def _check(x, residual, w: LayerWeights, cos, sin, k_cache, v_cache, pos, mask, heads) -> None:
    """Every operand's dtype, device and shape against x [B, 1, H] and the cache's [B, n_kv, S, d] keys."""
    dtype, (b, t, hidden) = x.dtype, x.shape
    if dtype not in (torch.float32, torch.bfloat16) or t != 1 or not x.is_cpu:
        raise _refuse(f"x must be [B, 1, H] float32 or bfloat16 on the CPU; got {tuple(x.shape)} {dtype} {x.device}")
    if k_cache.dim() != 4 or k_cache.shape[0] != b:
        raise _refuse(f"k_cache must be [{b}, n_kv, S, d]; got {tuple(k_cache.shape)}")
    _, kv_heads, slots, d = k_cache.shape
    if not 0 <= pos < slots:
        raise _refuse(f"slot {pos} of {slots}: the slot written must be 0 <= slot < S")
    kinds = {"act": dtype, "float32": torch.float32, "bool": torch.bool}
    operands = decode_layer_operands.expected(  # a decode step checks all 22, so one flat pass
        residual, w, cos, sin, k_cache, v_cache, mask, rows=b, hidden=hidden, heads=heads, mask_keys=pos + 1,
        cols=False,
    )  # fmt: skip
    problem = decode_layer_operands.mismatch(
        operands, kinds, lambda t, shape, kind: t.shape == shape and t.dtype is kind and t.is_cpu, " on the CPU"
    )
    if problem is not None:
        raise _refuse(problem)
    problem = decode_layer_operands.structure_problem(w, heads, tuple(k_cache.shape), cos.shape[-1])
    if problem is not None:
        raise _refuse(problem)
    if k_cache.stride() != (kv_heads * slots * d, slots * d, d, 1) or v_cache.stride() != (
        kv_heads * d * slots, d * slots, slots, 1,
    ):  # fmt: skip
        raise _refuse("k_cache and v_cache must be contiguous (the KV cache's own layer tensors)")


def decode_layer(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weights: LayerWeights,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: int,
    mask: torch.Tensor,
    *,
    heads: int,
    eps: float,
    scale: float,
    offset: float = 0.0,
    float32_weight: bool = False,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step of a pre-norm dense layer with a SwiGLU MLP: x [B, 1, H] (the previous layer's increment, or
    the embedding at layer 0 with residual None) and residual [B, 1, H] -> (this layer's MLP increment, the new
    residual), both [B, 1, H]; the step's keys and values are written into the full-length cache at slot `pos`
    (k_cache [B, n_kv, S, d], v_cache [B, n_kv, d, S]) and attended over slots 0..pos with mask [B, 1, pos + 1]
    bool. cos and sin [B, 1, r] float32; `eps`, `offset` and `float32_weight` are every norm's (add_rms_norm's
    options), `scale` and `softcap` the attention's."""
    _check(x, residual, weights, cos, sin, k_cache, v_cache, pos, mask, heads)
    functions = _functions()
    if functions is None:
        raise _refuse(f"the kernel is not built here: {build.unavailable('decode_layer')}")
    b, _, hidden = x.shape
    _, kv_heads, slots, d = k_cache.shape
    out, residual_out = torch.empty_like(x), torch.empty_like(x)
    x, cos, sin, mask = x.contiguous(), cos.contiguous(), sin.contiguous(), mask.contiguous()
    residual = None if residual is None else residual.contiguous()
    operands = {}  # bound until the call: a temporary's memory is freed with it
    for name, t in vars(weights).items():  # biases in float32
        operands[name] = None if t is None else (t.float() if name in decode_layer_operands.BIASES else t).contiguous()
    layer = _DecodeLayer(
        rows=b, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=d, rotated=cos.shape[-1],
        inter=weights.wd.shape[1], pos=pos, mask_row=pos + 1, k_batch=k_cache.stride(0), k_head=k_cache.stride(1),
        v_batch=v_cache.stride(0), v_head=v_cache.stride(1), v_row=v_cache.stride(2), eps=eps, offset=offset,
        scale=scale, cap=0.0 if softcap is None else softcap, float32_weight=float32_weight, cols=0,
        x=x.data_ptr(), residual=None if residual is None else residual.data_ptr(), cos=cos.data_ptr(),
        sin=sin.data_ptr(), k_cache=k_cache.data_ptr(), v_cache=v_cache.data_ptr(), mask=mask.data_ptr(),
        out=out.data_ptr(), residual_out=residual_out.data_ptr(),
        **{name: None if t is None else t.data_ptr() for name, t in operands.items()},
    )  # fmt: skip
    functions[x.dtype](ctypes.byref(layer))
    return out, residual_out
