"""PyTorch launcher of the CPU few-row product (kernels/cpu/gemv.c): `gemv(x2, weight, bias)` = x2 @ weight^T + bias.

torch_impl/linear.py offers it as the path "gemv" beside F.linear and oneDNN, chosen by measurement. The kernel
reads the torch layout (weight [out, in], the "rows" kernels) in float32 or bfloat16 and accumulates in float32;
the result is rounded once to the operands' dtype, like every other path. Called through ctypes on the tensors'
memory: the library is loaded after torch, so its OpenMP team is torch's own (the same libgomp.so.1), sized by
torch.set_num_threads. The call is registered as the operator `torch.ops.decoder_parity.gemv` (CPU), taken whenever a
dispatch mode (FlopCounterMode) or the profiler is active, so they see it like any other product. Inference only (no
autograd), CPU tensors only: `supports` says when it applies.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.cpu import build, gemv_fetch, torch_operator

MAX_ROWS = 8  # gemv.c's MAX_ROWS: more token rows are a GEMM, the libraries' ground
_P, _L = ctypes.c_void_p, ctypes.c_long


@functools.cache
def _functions() -> dict[torch.dtype, ctypes._CFuncPtr] | None:
    argtypes = [_P, _P, _P, _P, _L, _L, _L, _L]  # x, w, b, y, m, in, out, fetch
    table = build.functions(
        "gemv", {torch.float32: ("gemv_rows_f32", argtypes), torch.bfloat16: ("gemv_rows_bf16", argtypes)}
    )
    max_rows = None if table is None else build.load("gemv").gemv_max_rows()
    if table is not None and max_rows != MAX_ROWS:
        raise RuntimeError(f"kernels/cpu/gemv.c MAX_ROWS {max_rows} != torch_gemv.MAX_ROWS {MAX_ROWS}")
    return table


def available() -> bool:
    """Whether the kernel runs here (see kernels.cpu.build.unavailable("gemv") for why not)."""
    return _functions() is not None


def supports(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """x2 [rows <= MAX_ROWS, in], weight [out, in] contiguous, one dtype (float32 or bfloat16), all on the CPU.
    (Checked on every product of a decode step: plain comparisons, cheapest first.)"""
    dtype = weight.dtype
    return (
        (dtype is torch.float32 or dtype is torch.bfloat16)
        and x2.dtype is dtype
        and x2.dim() == 2
        and weight.dim() == 2
        and 0 < x2.shape[0] <= MAX_ROWS
        and x2.shape[1] == weight.shape[1]
        and x2.is_cpu
        and weight.is_cpu
        and (bias is None or (bias.dtype is dtype and bias.is_cpu and bias.shape == (weight.shape[0],)))
        and weight.is_contiguous()
        and available()
    )


def gemv(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x2 [rows, in] @ weight[out, in]^T (+ bias) -> [rows, out] in x2's dtype; a ValueError naming the tensor
    where `supports` does not hold."""
    if not supports(x2, weight, bias):
        raise ValueError(
            f"gemv: x {tuple(x2.shape)} {x2.dtype} {x2.device}, weight {tuple(weight.shape)} {weight.dtype} "
            f"(contiguous: {weight.is_contiguous()}), bias {None if bias is None else tuple(bias.shape)}: needs CPU "
            f"float32/bfloat16 tensors of one dtype, x [rows <= {MAX_ROWS}, in], weight [out, in] contiguous "
            f"(kernel available: {available()}; {build.unavailable('gemv') or 'built'})"
        )
    return launch(x2, weight, bias)


def launch(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`gemv` for a caller that has checked `supports` itself (torch_impl/linear.py's forms_for): a decode step
    makes ~170 of these calls, each one checked already."""
    if not torch._C._len_torch_dispatch_stack() and not torch.autograd.profiler._is_profiler_enabled:
        return _run(x2, weight, bias)  # nobody to see the operator: its dispatch would cost more than the call
    return _operator()(x2, weight, bias)


def _run(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    f32 = x2.dtype is torch.float32
    x32 = (x2 if f32 else x2.float()).contiguous()  # [rows, in]: a copy only where x2 is bf16 or strided (KBs)
    b32 = None if bias is None else (bias if f32 else bias.float()).contiguous()
    rows, out_features = x2.shape[0], weight.shape[0]
    out = torch.empty(rows, out_features, dtype=torch.float32)  # [rows, out]
    _functions()[weight.dtype](
        x32.data_ptr(), weight.data_ptr(), None if b32 is None else b32.data_ptr(), out.data_ptr(),
        rows, x2.shape[1], out_features, fetch(weight.dtype),
    )  # fmt: skip
    return out if f32 else out.to(x2.dtype)


def fetch(dtype: torch.dtype) -> int:
    """gemv.h's `fetch` for torch's layout ("rows") in `dtype` (float32 or bfloat16): kernels/cpu/gemv_fetch.py's
    choice, which torch_decode_layer's products take too."""
    return gemv_fetch.fetch(str(dtype).removeprefix("torch."), "rows")


@functools.cache
def _operator():
    """torch.ops.decoder_parity.gemv, defined once per process."""
    return torch_operator.define("gemv", "gemv(Tensor x, Tensor weight, Tensor? bias) -> Tensor", _run)


_operator()  # at import: FlopCounterMode copies the FLOP formulas when it is created, maybe before the first call
