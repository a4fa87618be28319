"""PyTorch launchers of the CPU many-row bfloat16 products: `gemm(x2, weight, bias)` = x2 @ weight^T + bias on AMX
tiles (kernels/cpu/gemm_amx_rows.c), and `upcast(x2, weight, bias)`, the same product computed in float32 by gemm.c's
loops, each bf16 value widened exactly as it is packed (kernels/cpu/gemm_upcast_rows.c: AVX-512F alone).

torch_impl/linear.py offers `gemm` as the path "gemm" beside F.linear and oneDNN for products of more than a decode
step's rows (a prompt's), chosen by measurement; the twin of kernels/cpu/jax_gemm.py, whose kernel reads Flax's
layout. `gemm` reads nn.Linear's weight [out, in] in place, bfloat16, accumulates in float32 and rounds the result
once to bfloat16 as torch rounds (or returns the float32 sum: `out_dtype`). Called through ctypes on the tensors'
memory, on torch's OpenMP team (the library is loaded after torch: the same libgomp.so.1, sized by
torch.set_num_threads). Registered as the operator `torch.ops.decoder_parity.gemm` (CPU), taken whenever a dispatch
mode (FlopCounterMode) or the profiler is active. Inference only (no autograd), CPU tensors only, and only where the
processor has AMX (kernels/cpu/build.py's ISA): `supports` says when `gemm` applies.

`upcast` is the path "upcast" of torch_impl/linear.py, the twin of kernels/cpu/jax_gemm.py's `upcast` (the same
loops, on Flax's layout), for processors whose bf16 instructions, where they have any, run below their float32 FMAs:
the same contract and checks (`supports_upcast`, `upcast_available`), its operator `torch.ops.decoder_parity.upcast`.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.cpu import build, torch_gemv, torch_operator

MIN_ROWS = torch_gemv.MAX_ROWS + 1  # fewer token rows are a decode step's: kernels/cpu/gemv.c streams those
LIBRARY = "gemm_amx_rows"
UPCAST_LIBRARY = "gemm_upcast_rows"
UPCAST_MAX_IN = (2**31 - 1) // 15  # gemm.c gathers W's rows at int32 offsets up to 15 * in (gemm_upcast_rows.c)
_P, _L = ctypes.c_void_p, ctypes.c_long
_refused: list[str] = []


@functools.cache
def _function() -> ctypes._CFuncPtr | None:
    lib = build.load(LIBRARY)
    if lib is None:
        return None
    if (err := lib.gemm_amx_rows_permit()) != 0:
        _refused.append(f"Linux refused the AMX tile state (arch_prctl returned {err})")
        return None
    fn = lib.gemm_amx_rows_bf16
    fn.argtypes, fn.restype = [_P, _P, _P, _P, _L, _L, _L, ctypes.c_int], ctypes.c_int
    return fn


def available() -> bool:
    """Whether the kernel runs here (`unavailable` says why not)."""
    return _function() is not None


def unavailable() -> str | None:
    """Why the kernel is not available in this process, or None (available, or not asked for yet)."""
    return _refused[0] if _refused else build.unavailable(LIBRARY)


@functools.cache
def _upcast_function() -> ctypes._CFuncPtr | None:
    lib = build.load(UPCAST_LIBRARY)
    if lib is None:
        return None
    fn = lib.gemm_upcast_rows_bf16
    fn.argtypes, fn.restype = [_P, _P, _P, _P, _P, _L, _L, _L], ctypes.c_int
    return fn


def upcast_available() -> bool:
    """Whether `upcast`'s kernel runs here (`build.unavailable(UPCAST_LIBRARY)` says why not)."""
    return _upcast_function() is not None


def supports(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """x2 [rows >= MIN_ROWS, in], weight [out, in] contiguous, bias [out] or None, all bfloat16 on the CPU, and
    the kernel built here."""
    return _operands_fit(x2, weight, bias) and available()


def supports_upcast(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """`supports`' operands with at most UPCAST_MAX_IN in-features, and `upcast`'s kernel built here."""
    return _operands_fit(x2, weight, bias) and weight.shape[1] <= UPCAST_MAX_IN and upcast_available()


def _operands_fit(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (
        x2.dtype is torch.bfloat16
        and weight.dtype is torch.bfloat16
        and x2.dim() == 2
        and weight.dim() == 2
        and x2.shape[0] >= MIN_ROWS
        and x2.shape[1] == weight.shape[1] > 0
        and weight.shape[0] > 0
        and x2.is_cpu
        and weight.is_cpu
        and (bias is None or (bias.dtype is torch.bfloat16 and bias.is_cpu and bias.shape == (weight.shape[0],)))
        and weight.is_contiguous()
    )


def gemm(
    x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """x2 [rows, in] @ weight[out, in]^T (+ bias) -> [rows, out], rounded to bfloat16 (out_dtype None or
    torch.bfloat16) or the float32 sum (torch.float32); a ValueError naming the tensors where `supports` does not
    hold."""
    return _checked("gemm", x2, weight, bias, out_dtype)


def upcast(
    x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`gemm`'s product and contract, computed by gemm.c's float32 loops on the widened operands (`supports_upcast`
    for `supports`)."""
    return _checked("upcast", x2, weight, bias, out_dtype)


def launch(
    x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`gemm` for a caller that has checked `supports` itself (torch_impl/linear.py's forms_for)."""
    return _launch("gemm", x2, weight, bias, out_dtype)


def launch_upcast(
    x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`upcast` for a caller that has checked `supports_upcast` itself (torch_impl/linear.py's forms_for)."""
    return _launch("upcast", x2, weight, bias, out_dtype)


def _checked(
    name: str, x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None
) -> torch.Tensor:
    fits, built, why = _CHECKS[name]
    if not fits(x2, weight, bias) or out_dtype not in (None, torch.bfloat16, torch.float32):
        limit = f" with in <= {UPCAST_MAX_IN}" if name == "upcast" else ""
        raise ValueError(
            f"{name}: x {tuple(x2.shape)} {x2.dtype} {x2.device}, weight {tuple(weight.shape)} {weight.dtype} "
            f"(contiguous: {weight.is_contiguous()}), bias {None if bias is None else tuple(bias.shape)}, out_dtype "
            f"{out_dtype}: needs CPU bfloat16 tensors, x [rows >= {MIN_ROWS}, in], weight [out, in] contiguous{limit}, "
            f"bias [out], out_dtype bfloat16 or float32 (kernel available: {built()}; {why() or 'built'})"
        )
    return _launch(name, x2, weight, bias, out_dtype)


def _launch(
    name: str, x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None
) -> torch.Tensor:
    f32 = out_dtype is torch.float32
    if not torch._C._len_torch_dispatch_stack() and not torch.autograd.profiler._is_profiler_enabled:
        return _RUNS[name](x2, weight, bias, f32)  # nobody to see the operator: skip its dispatch
    return _operator(name)(x2, weight, bias, f32)


def _run(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, f32: bool) -> torch.Tensor:
    x2 = x2.contiguous()  # [rows, in]: a copy only where x2 is strided
    rows, out_features = x2.shape[0], weight.shape[0]
    out = torch.empty(rows, out_features, dtype=torch.float32 if f32 else torch.bfloat16)  # [rows, out]
    b = None if bias is None else bias.contiguous()
    err = _function()(
        x2.data_ptr(), weight.data_ptr(), None if b is None else b.data_ptr(), out.data_ptr(),
        rows, x2.shape[1], out_features, int(f32),
    )  # fmt: skip
    if err != 0:
        raise MemoryError(f"gemm: no memory for the packed copy of x {tuple(x2.shape)} (kernels/cpu/gemm_amx_rows.c)")
    return out


def _run_upcast(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, f32: bool) -> torch.Tensor:
    x2 = x2.contiguous()  # [rows, in]: a copy only where x2 is strided
    rows, out_features = x2.shape[0], weight.shape[0]
    sums = torch.empty(rows, out_features, dtype=torch.float32)  # [rows, out]: the result itself where f32
    out = None if f32 else torch.empty(rows, out_features, dtype=torch.bfloat16)  # [rows, out]
    b = None if bias is None else bias.contiguous()
    err = _upcast_function()(
        x2.data_ptr(), weight.data_ptr(), None if b is None else b.data_ptr(), sums.data_ptr(),
        None if out is None else out.data_ptr(), rows, x2.shape[1], out_features,
    )  # fmt: skip
    if err == -2:
        raise ValueError(f"upcast: weight {tuple(weight.shape)} has more than {UPCAST_MAX_IN} in-features")
    if err != 0:
        raise MemoryError(f"upcast: no memory for a thread's packing buffers (kernels/cpu/gemm.c), x {tuple(x2.shape)}")
    return sums if out is None else out


_RUNS = {"gemm": _run, "upcast": _run_upcast}
_CHECKS = {  # per product: (its operands fit and it is built, it is built, why it is not)
    "gemm": (supports, available, unavailable),
    "upcast": (supports_upcast, upcast_available, lambda: build.unavailable(UPCAST_LIBRARY)),
}


@functools.cache
def _operator(name: str):
    """torch.ops.decoder_parity.<name> ("gemm", "upcast"), defined once per process."""
    schema = f"{name}(Tensor x, Tensor weight, Tensor? bias, bool f32) -> Tensor"
    return torch_operator.define(name, schema, _RUNS[name])


for _name in _RUNS:  # at import: FlopCounterMode copies the FLOP formulas when it is created, maybe before a call
    _operator(_name)
