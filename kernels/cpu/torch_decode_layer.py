"""PyTorch launcher of a whole pre-norm decoder layer of a CPU decode step in one call (kernels/cpu/decode_layer.c).

torch_impl/decoder_layer.py's DecoderLayer runs a dense layer's decode step through `decode_layer` where every one
of its products took the few-row kernel (kernels/cpu/torch_gemv.py) and its small operators would run as
kernels/cpu/torch_decode_ops.py's calls: the same functions in the same order, so the result is the per-operator
layer's, bit for bit (the tests hold it to that), at one call instead of ~30. Operands are checked here, so a
direct caller gets an error naming the tensor; the layer passes its own parameters and cache. Called through ctypes
on the tensors' memory; the layer's OpenMP region is torch's own team (the library is loaded after torch, as
torch_gemv.py's is). Consecutive layers' prepared calls run in one call too: kernels/cpu/torch_decode_stack.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import weakref
from collections.abc import Callable

import torch

from kernels.cpu import build, decode_layer_operands, torch_gemv
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


class LayerStruct(ctypes.Structure):
    """decode_layer.h's DecodeLayer, field for field."""

    _fields_ = [
        *[(name, _L) for name in (*_LONGS, *_STRIDES)],
        *[(name, _F) for name in ("eps", "offset", "scale", "cap")],
        *[(name, _I) for name in ("float32_weight", "cols", "fetch")],
        *[(name, _P) for name in _POINTERS],
    ]


@functools.cache
def _functions() -> dict[torch.dtype, ctypes._CFuncPtr] | None:
    argtypes = [ctypes.POINTER(LayerStruct)]
    return build.functions(
        "decode_layer", {torch.float32: ("decode_layer_f32", argtypes), torch.bfloat16: ("decode_layer_bf16", argtypes)}
    )


def available() -> bool:
    """Whether the kernel runs here (kernels.cpu.build.unavailable("decode_layer"): why not)."""
    return _functions() is not None


def refuse(problem: str) -> ValueError:
    return ValueError(f"kernels.cpu decode_layer: {problem}")


def _check(x, residual, w: LayerWeights, cos, sin, k_cache, v_cache, pos, mask, heads) -> None:
    """Every operand's dtype, device and shape against x [B, 1, H] and the cache's [B, n_kv, S, d] keys."""
    dtype, (b, t, hidden) = x.dtype, x.shape
    if dtype not in (torch.float32, torch.bfloat16) or t != 1 or not x.is_cpu:
        raise refuse(f"x must be [B, 1, H] float32 or bfloat16 on the CPU; got {tuple(x.shape)} {dtype} {x.device}")
    if k_cache.dim() != 4 or k_cache.shape[0] != b:
        raise refuse(f"k_cache must be [{b}, n_kv, S, d]; got {tuple(k_cache.shape)}")
    _, kv_heads, slots, d = k_cache.shape
    if not 0 <= pos < slots:
        raise refuse(f"slot {pos} of {slots}: the slot written must be 0 <= slot < S")
    kinds = {"act": dtype, "float32": torch.float32, "bool": torch.bool}
    operands = decode_layer_operands.expected(  # a decode step checks all 22, so one flat pass
        residual, w, cos, sin, k_cache, v_cache, mask, rows=b, hidden=hidden, heads=heads, mask_keys=pos + 1,
        cols=False,
    )  # fmt: skip
    problem = decode_layer_operands.mismatch(
        operands, kinds, lambda t, shape, kind: t.shape == shape and t.dtype is kind and t.is_cpu, " on the CPU"
    )
    if problem is not None:
        raise refuse(problem)
    problem = decode_layer_operands.structure_problem(w, heads, tuple(k_cache.shape), cos.shape[-1])
    if problem is not None:
        raise refuse(problem)
    if k_cache.stride() != (kv_heads * slots * d, slots * d, d, 1) or v_cache.stride() != (
        kv_heads * d * slots, d * slots, slots, 1,
    ):  # fmt: skip
        raise refuse("k_cache and v_cache must be contiguous (the KV cache's own layer tensors)")


def _fingerprint(tensors) -> tuple:
    """Each tensor's address, shape, strides and dtype (None for None): what the kernel's struct took from it (a
    `.data` reassigned to a transposed view of the same memory keeps the address and, square, the shape)."""
    return tuple(None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype) for t in tensors)


def _weak(t: torch.Tensor | None) -> Callable[[], torch.Tensor | None]:
    return (lambda: None) if t is None else weakref.ref(t)


class LayerCall:
    """One layer's decode step through decode_layer.c, its steady operands (the weights, the cache, the options)
    checked and laid into the kernel's struct at the first step; a later step checks and sets only what moves (x,
    residual, cos, sin, mask, the slot). A layer keeps its LayerCall while it `stands_for` the layer's weights and
    cache (torch_impl/decoder_layer.py). It holds them weakly (a finished generation's cache, or weights replaced
    since, are freed as usual) and the biases, widened to float32 each step so that a write to one is seen."""

    def __init__(
        self, weights: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor, *, heads: int, eps: float,
        scale: float, offset: float = 0.0, float32_weight: bool = False, softcap: float | None = None,
    ):  # fmt: skip
        self.heads = heads
        self._options = dict(eps=eps, offset=offset, scale=scale, cap=0.0 if softcap is None else softcap,
                             float32_weight=float32_weight)  # fmt: skip
        self._pending: tuple | None = (weights, k_cache, v_cache)  # held until the first step lays them out
        operands = (*vars(weights).values(), k_cache, v_cache)
        self._refs, self._fingerprint = tuple(_weak(t) for t in operands), _fingerprint(operands)
        self._biases = {name: t for name in decode_layer_operands.BIASES if (t := getattr(weights, name)) is not None}
        self._layer: LayerStruct | None = None  # laid out at the first step, once every operand is checked
        self._step_shapes: tuple = ()
        self._copied = False

    def __deepcopy__(self, memo) -> None:
        return None  # a copy of its layer has tensors of its own: it prepares its own call

    def __reduce__(self):
        return type(None), ()  # addresses of this process's memory: a pickled layer carries no call

    def stands_for(
        self, weights: LayerWeights | tuple[torch.Tensor | None, ...], k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> bool:
        """Whether this call computes with these operands (`weights` as LayerWeights or its fields' values in
        order): the same tensors, at the same addresses, of the same shapes, strides and dtypes, none of the weights
        copied to be contiguous (a copy would not see a write to its original). Asked of every layer at every step:
        each operand compared in turn, the first difference ends it."""
        if self._copied:
            return False
        operands = (*(weights if isinstance(weights, tuple) else vars(weights).values()), k_cache, v_cache)
        for ref, t, held in zip(self._refs, operands, self._fingerprint, strict=True):
            if ref() is not t:
                return False
            if t is not None and (t.data_ptr(), t.shape, t.stride(), t.dtype) != held:
                return False
        return True

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, pos: int,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        if self._layer is None:
            self._first_step(x, residual, cos, sin, pos, mask)
        else:
            self.check_step(x, residual, cos, sin, pos, mask)
        x, cos, sin, mask = x.contiguous(), cos.contiguous(), sin.contiguous(), mask.contiguous()
        residual = None if residual is None else residual.contiguous()
        out, residual_out = torch.empty_like(x), torch.empty_like(x)
        layer = self._layer
        set_step(layer, x, residual, cos, sin, pos, mask)
        layer.out, layer.residual_out = out.data_ptr(), residual_out.data_ptr()
        biases = self.widen_biases(layer)  # noqa: F841  (bound until the call)
        self._function(ctypes.byref(layer))
        return out, residual_out

    @property
    def struct(self) -> LayerStruct | None:
        """The kernel's struct for this layer, laid out at the first step (None before it): a LayerStack copies it."""
        return self._layer

    @property
    def step_shapes(self) -> tuple:
        """What the first step fixed: (dtype, x's shape, cos's shape, the cache's slots); () before it."""
        return self._step_shapes

    @property
    def laid_out(self) -> bool:
        """Whether a step ran (checked every operand and laid out the struct): a LayerStack takes only such calls."""
        return self._layer is not None

    @property
    def alive(self) -> bool:
        """Whether every tensor the struct points into still exists (a LayerStack refuses to run otherwise)."""
        pairs = zip(self._refs, self._fingerprint, strict=True)
        return all(ref() is not None for ref, held in pairs if held is not None)

    @property
    def copied(self) -> bool:
        """Whether the first step copied a weight to make it contiguous: such a call stands for nothing after it."""
        return self._copied

    def widen_biases(self, layer: LayerStruct) -> list[torch.Tensor]:
        """The biases widened to float32 and set on `layer`; the caller keeps the returned tensors until the call
        (their memory is the kernel's operand)."""
        widened = []
        for name, t in self._biases.items():
            widened.append(t.float().contiguous())
            setattr(layer, name, widened[-1].data_ptr())
        return widened

    def _first_step(self, x, residual, cos, sin, pos, mask) -> None:
        weights, k, v = self._pending
        _check(x, residual, weights, cos, sin, k, v, pos, mask, self.heads)
        functions = _functions()
        if functions is None:
            raise refuse(f"the kernel is not built here: {build.unavailable('decode_layer')}")
        self._function = functions[x.dtype]
        b, _, hidden = x.shape
        _, kv_heads, slots, d = k.shape
        self._step_shapes = (x.dtype, (b, 1, hidden), (b, 1, cos.shape[-1]), slots)
        steady = {
            name: t.contiguous() for name, t in vars(weights).items()
            if t is not None and name not in decode_layer_operands.BIASES
        }  # fmt: skip
        self._copied = any(t is not getattr(weights, name) for name, t in steady.items())
        self._layer = LayerStruct(
            rows=b, hidden=hidden, heads=self.heads, kv_heads=kv_heads, head_dim=d, rotated=cos.shape[-1],
            inter=weights.wd.shape[1], k_batch=k.stride(0), k_head=k.stride(1), v_batch=v.stride(0),
            v_head=v.stride(1), v_row=v.stride(2), cols=0, fetch=torch_gemv.fetch(x.dtype),
            k_cache=k.data_ptr(), v_cache=v.data_ptr(),
            **self._options, **{name: t.data_ptr() for name, t in steady.items()},
        )  # fmt: skip
        self._pending = None  # a copy made above is read by this step only: it never stands again

    def check_step(self, x, residual, cos, sin, pos, mask) -> None:
        """The first step's checks of what a step changes, against the shapes that step fixed."""
        dtype, hidden_shape, rope_shape, slots = self._step_shapes
        if x.dtype is not dtype or x.shape != hidden_shape or not x.is_cpu:
            raise refuse(f"x must be {list(hidden_shape)} {dtype} on the CPU; got {tuple(x.shape)} {x.dtype}")
        if not 0 <= pos < slots:
            raise refuse(f"slot {pos} of {slots}: the slot written must be 0 <= slot < S")
        operands = [
            ("residual", residual, hidden_shape, "act", True), ("cos", cos, rope_shape, "float32", False),
            ("sin", sin, rope_shape, "float32", False), ("mask", mask, (hidden_shape[0], 1, pos + 1), "bool", False),
        ]  # fmt: skip
        kinds = {"act": dtype, "float32": torch.float32, "bool": torch.bool}
        problem = decode_layer_operands.mismatch(
            operands, kinds, lambda t, shape, kind: t.shape == shape and t.dtype is kind and t.is_cpu, " on the CPU"
        )
        if problem is not None:
            raise refuse(problem)


def set_step(layer: LayerStruct, x, residual, cos, sin, pos: int, mask) -> None:
    layer.pos, layer.mask_row = pos, pos + 1
    layer.x, layer.residual = x.data_ptr(), None if residual is None else residual.data_ptr()
    layer.cos, layer.sin, layer.mask = cos.data_ptr(), sin.data_ptr(), mask.data_ptr()


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
    options), `scale` and `softcap` the attention's. A LayerCall made for this one step."""
    options = dict(eps=eps, scale=scale, offset=offset, float32_weight=float32_weight, softcap=softcap)
    return LayerCall(weights, k_cache, v_cache, heads=heads, **options)(x, residual, cos, sin, pos, mask)
