"""PyTorch launcher of the CPU generation's small operators (kernels/cpu/decode_ops.c, attend.c): `add_rms_norm`,
`rotary`, `norm_rotary` (the two in turn on q and k), `attend` and `silu_and_mul`, each with its reference's contract
(kernels/triton/reference.py's add_rms_norm_reference and silu_and_mul_reference, torch_impl/rotary_embedding.py's
apply_rotary, torch_impl/attention.py's attend): the same arguments, shapes, dtypes and roundings.

In eager PyTorch each of these is 5-10 operators, each a pass over its rows through float32 temporaries: at a decode
step's few token rows the dispatches are the cost (a few microseconds each on a few thousand elements), at a prompt's
hundreds of rows the passes are (a bfloat16 add+RMSNorm is seven of them). torch_impl's layers call one of these
instead where the rule holds (`takes`, and `takes_step` for what only a decode step takes: decode_layer.c's one-call
layer), a rule rather than a measurement: one call against several of the same arithmetic, on the same threads where
there are any to use (a call over enough rows runs on torch's OpenMP team), which no processor turns around
(benchmarks/cpu_decode.py measures the step with and without them). Only torch_impl's generation opts in
(`decode_steps()` around each decode step, `prompts()` around its prompt); everywhere else (training, the parity checks
and their mutants, another device, a dispatch or function mode such as FlopCounterMode or a fake tensor, the profiler,
a machine where the kernels could not be built) the layers keep the reference, so what autograd, the parity traces and
the FLOP counts see is unchanged. Called through ctypes on the tensors' memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools

import torch

from kernels.cpu import build
from kernels.cpu.switch import Switch
from kernels.triton.reference import check_add_rms_norm_args, check_silu_and_mul_args

MAX_ROWS = 8  # the most batch rows of a decode step the layers take these for (a larger batch: the reference)
ROWS_MIN_STEPS = 2  # steps from which `attend` runs attend.c's blocked kernel: decode_ops.h's kAttendRowsMinSteps
_P, _L, _F, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_int
_SIGNATURES = {
    "add_rms_norm": [_P, _P, _P, _P, _P, _L, _L, _F, _F, _I],
    "rotary": [_P, _P, _P, _P, _L, _L, _L, _L],
    "attend": [_P, _P, _P, _P, _P, _L, _L, _L, _L, _L, _L, _L, _L, _F, _F],
    "attend_rows": [_P, _P, _P, _P, _P, _L, _L, _L, _L, _L, _L, _L, _L, _F, _F],
    "silu_and_mul": [_P, _P, _L, _L],
    "norm_rotary": [_P, _P, _P, _P, _P, _P, _P, _P, _L, _L, _L, _L, _L, _F, _F, _I],
}
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_DECODING = Switch("torch_decode_ops.decoding")
_PROMPT = Switch("torch_decode_ops.prompt")
_OFF = Switch("torch_decode_ops.off")


@functools.cache
def _functions() -> dict[tuple[str, torch.dtype], ctypes._CFuncPtr] | None:
    symbols = {
        (name, dtype): (f"{name}_{suffix}", argtypes)
        for name, argtypes in _SIGNATURES.items()
        for dtype, suffix in _SUFFIX.items()
    }
    return build.functions("decode_ops", symbols)


def available() -> bool:
    """Whether the kernels run here (kernels.cpu.build.unavailable("decode_ops"): why not)."""
    return _functions() is not None


def decode_steps() -> contextlib.AbstractContextManager[None]:
    """Within the block (this thread) the layers may take these operators for a decode step's rows:
    torch_impl/generate.py enters it for its decode steps only, so that no other forward -- a parity trace or mutant of
    one token, training -- changes what it computes with."""
    return _DECODING.on()


def prompts() -> contextlib.AbstractContextManager[None]:
    """Within the block (this thread) the layers may take these operators (`takes`, the attention's blocked kernel
    included) for any number of token rows: torch_impl/generate.py enters it for its prompt's forward."""
    return _PROMPT.on()


def reference_only() -> contextlib.AbstractContextManager[None]:
    """Within the block the layers keep the reference everywhere, prompts and decode steps included (this thread): the
    benchmark's and the tests' side-by-side runs."""
    return _OFF.on()


def _step_rows(x: torch.Tensor) -> bool:
    """x [B, T, ...] is a decode step's: one token per row (T = 1), at most MAX_ROWS rows."""
    return x.dim() >= 3 and x.shape[1] == 1 and 0 < x.shape[0] <= MAX_ROWS


def _plain(x: torch.Tensor, operands: tuple[torch.Tensor | None, ...]) -> bool:
    """A CPU float32 or bfloat16 x [B, T, ...], nothing to differentiate, no dispatch or function mode and no profiler
    watching, the kernels built (plain comparisons, cheapest first)."""
    dtype = x.dtype
    return (
        not _OFF.get()
        and (dtype is torch.float32 or dtype is torch.bfloat16)
        and x.is_cpu
        and x.dim() >= 3
        and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *operands)))
        and not torch._C._len_torch_dispatch_stack()
        and not torch._C._is_torch_function_mode_enabled()
        and not torch.autograd.profiler._is_profiler_enabled
        and available()
    )


def takes(x: torch.Tensor, *operands: torch.Tensor | None) -> bool:
    """Whether a layer runs its row operator (a norm, a rotation, SwiGLU) on `x` [B, T, ...] (and its other
    `operands`: a norm's weight and residual, RoPE's cos and sin) here: a decode step's rows inside `decode_steps()`
    (`takes_step`), or any rows inside `prompts()`; not `reference_only()`; a CPU float32 or bfloat16 tensor, nothing
    to differentiate, nobody watching, the kernels built."""
    return ((_DECODING.get() and _step_rows(x)) or _PROMPT.get()) and _plain(x, operands)


def takes_step(x: torch.Tensor, *operands: torch.Tensor | None) -> bool:
    """`takes`, for what only a decode step's rows take (decode_layer.c's one call): inside `decode_steps()`, one
    token per row (T = 1) and at most MAX_ROWS rows."""
    return _DECODING.get() and _step_rows(x) and _plain(x, operands)


def takes_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """`takes(q)`, with keys and values of q's dtype: a decode step's rows, or a prompt's (its many query steps run
    attend.c's blocked kernel, `attend`), on torch's threads."""
    return k.dtype is q.dtype and v.dtype is q.dtype and takes(q, k, v)


def _refuse(op: str, problem: str) -> ValueError:
    return ValueError(f"kernels.cpu {op}: {problem}")


def _same(op: str, x: torch.Tensor, *others: torch.Tensor) -> None:
    """The operands share x's dtype (float32 or bfloat16) and the CPU, and the kernels are built (the layers asked
    `takes` already; a direct caller is told what is wrong)."""
    dtype = x.dtype
    if (
        (dtype is torch.float32 or dtype is torch.bfloat16)
        and x.is_cpu
        and all(t.dtype is dtype and t.is_cpu for t in others)
    ):
        if available():
            return
        raise _refuse(op, f"the kernels are not built here: {build.unavailable('decode_ops')}")
    found = ", ".join(f"{t.dtype} on {t.device}" for t in (x, *others))
    raise _refuse(op, f"needs float32 or bfloat16 CPU tensors of one dtype; got {found}")


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    offset: float = 0.0,
    float32_weight: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """add_rms_norm_reference's result: out [..., H], or (out, new residual) with a residual."""
    check_add_rms_norm_args(x, residual, weight, eps)  # the reference's own checks: the same calls are legal
    _same("add_rms_norm", x, weight, *(() if residual is None else (residual,)))
    dim = x.shape[-1]
    x, weight = x.contiguous(), weight.contiguous()  # bound: a temporary's memory is freed with it
    residual = None if residual is None else residual.contiguous()
    out = torch.empty_like(x)
    new = None if residual is None else torch.empty_like(x)
    _functions()["add_rms_norm", x.dtype](
        x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(), out.data_ptr(),
        None if new is None else new.data_ptr(), x.numel() // dim, dim, eps, offset, float32_weight,
    )  # fmt: skip
    return out if new is None else (out, new)


def _rotated_dims(op: str, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> int:
    """The r rotated dims of x [B, T, n, d]: cos and sin must be [B, T, r] float32 with r even, r <= d."""
    b, t, _, d = x.shape
    r = cos.shape[-1]
    if cos.shape != (b, t, r) or sin.shape != cos.shape or r % 2 or r > d:
        got = f"cos {tuple(cos.shape)}, sin {tuple(sin.shape)}"
        raise _refuse(op, f"x {tuple(x.shape)} needs cos, sin [{b}, {t}, r] with r even, r <= {d}; got {got}")
    if cos.dtype is not torch.float32 or sin.dtype is not torch.float32:
        raise _refuse(op, f"cos and sin must be float32, got {cos.dtype} and {sin.dtype}")
    return r


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary's result: x [B, T, n, d] with cos, sin [B, T, r] float32 (r even, r <= d)."""
    _same("rotary", x)
    b, t, n, d = x.shape
    r = _rotated_dims("rotary", x, cos, sin)
    x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
    out = torch.empty_like(x)
    _functions()["rotary", x.dtype](x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), b * t, n, d, r)
    return out


def norm_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    offset: float = 0.0,
    float32_weight: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rotary(add_rms_norm(q, None, q_weight, eps, ...), cos, sin) and the same for k with k_weight, in one call:
    q [B, T, n, d], k [B, T, n_kv, d], the weights [d] (a per-head norm: Qwen3's q/k norms), cos and sin
    [B, T, r] float32."""
    check_add_rms_norm_args(q, None, q_weight, eps, op="norm_rotary")  # the norm's own checks, for q and for k
    check_add_rms_norm_args(k, None, k_weight, eps, op="norm_rotary")
    _same("norm_rotary", q, k, q_weight, k_weight)
    if q.dim() != 4 or k.dim() != 4 or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        got = f"q {tuple(q.shape)}, k {tuple(k.shape)}"
        raise _refuse("norm_rotary", f"needs q [B, T, n, d] and k [B, T, n_kv, d]; got {got}")
    b, t, n, d = q.shape
    r = _rotated_dims("norm_rotary", q, cos, sin)
    q, k, cos, sin = q.contiguous(), k.contiguous(), cos.contiguous(), sin.contiguous()
    q_weight, k_weight = q_weight.contiguous(), k_weight.contiguous()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _functions()["norm_rotary", q.dtype](
        q.data_ptr(), k.data_ptr(), q_weight.data_ptr(), k_weight.data_ptr(), cos.data_ptr(), sin.data_ptr(),
        q_out.data_ptr(), k_out.data_ptr(), b * t, n, k.shape[2], d, r, eps, offset, float32_weight,
    )  # fmt: skip
    return q_out, k_out


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None = None
) -> torch.Tensor:
    """torch_impl.attention.attend's result: q [B, T, n_kv, g, d], k [B, n_kv, S, d], v [B, n_kv, d, S] (the KV
    cache's views: rows of keys and of values contiguous), mask [B, T, S] bool -> [B, T, n_kv, g, d]."""
    _same("attend", q, k, v)
    b, t, n_kv, g, d = q.shape
    s = k.shape[2]
    if k.shape != (b, n_kv, s, d) or v.shape != (b, n_kv, d, s) or mask.shape != (b, t, s) or mask.dtype != torch.bool:
        want = f"k [{b}, {n_kv}, S, {d}], v [{b}, {n_kv}, {d}, S], mask [{b}, {t}, S] bool"
        got = f"k {tuple(k.shape)}, v {tuple(v.shape)}, mask {tuple(mask.shape)} {mask.dtype}"
        raise _refuse("attend", f"q {tuple(q.shape)} needs {want}; got {got}")
    if k.stride(3) != 1 or k.stride(2) != d or v.stride(3) != 1:
        k, v = k.contiguous(), v.contiguous()  # the cache's own views never need this
    q, mask = q.contiguous(), mask.contiguous()
    out = torch.empty_like(q)
    kernel = "attend" if t < ROWS_MIN_STEPS else "attend_rows"  # a prompt's many steps: blocks of query rows
    fn, cap = _functions()[kernel, q.dtype], 0.0 if softcap is None else softcap
    pointers = [(t.data_ptr(), t.stride(0) * t.element_size()) for t in (q, k, v, mask, out)]
    for row in range(b):  # [T, n_kv, g, d] of one batch row: each operand's address of that row
        fn(*[start + row * step for start, step in pointers], t, n_kv, g, d, s, k.stride(1), v.stride(1), v.stride(2),
           scale, cap)  # fmt: skip
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu_and_mul_reference's result: x [..., 2I] (gate first) -> [..., I] in x's dtype."""
    check_silu_and_mul_args(x, op="silu_and_mul")  # the reference's own checks: the same calls are legal
    _same("silu_and_mul", x)
    x = x.contiguous()
    inter = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], inter, dtype=x.dtype)  # [..., I]
    _functions()["silu_and_mul", x.dtype](x.data_ptr(), out.data_ptr(), x.numel() // (2 * inter), inter)
    return out
