"""Plain-PyTorch references for the fused ops, and the argument checks every implementation shares.

These functions *are* the contract (docs/design.md, "The numerics contract of add_rms_norm"): the Triton kernels in
this package are tested against them, torch_impl calls them on `kernels="reference"`, and their JAX twins
live in kernels/pallas/reference.py. No triton import here: the reference path must work without triton.

Argument checks live here too (not in the kernels) so that the reference and the fused path reject the
same bad input with the same message: switching `kernels=` never changes which calls are legal.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

__all__ = [
    "SUPPORTED_DTYPES",
    "add_rms_norm_reference",
    "check_add_rms_norm_args",
    "check_norm_options",
    "check_silu_and_mul_args",
    "gelu_tanh_and_mul_reference",
    "silu_and_mul_reference",
]

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_dtype(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise TypeError(f"{op}: {name} has dtype {t.dtype}; supported dtypes are {names}")


def check_add_rms_norm_args(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, *, op: str = "add_rms_norm"
) -> None:
    """Raise a ValueError/TypeError naming the offending argument if the call breaks the contract."""
    _check_dtype(op, "x", x)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"{op}: x must have shape [..., H] with H >= 1, got {tuple(x.shape)}")
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"{op}: residual has shape {tuple(residual.shape)} but x has shape {tuple(x.shape)}")
        if residual.dtype != x.dtype:
            raise TypeError(f"{op}: residual has dtype {residual.dtype} but x has dtype {x.dtype}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(
            f"{op}: weight has shape {tuple(weight.shape)}, expected ({x.shape[-1]},) to match the last dim of x"
        )
    if weight.dtype != x.dtype:
        raise TypeError(f"{op}: weight has dtype {weight.dtype} but x has dtype {x.dtype}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"{op}: eps must be a finite Python float > 0, got {eps!r}")


def check_norm_options(offset: float, float32_weight: bool, *, op: str = "add_rms_norm") -> None:
    """Raise a ValueError/TypeError naming the option if add_rms_norm's family options are not plain values.

    The fused kernels take them as compile-time values: offset a finite real number (Gemma: 1.0), float32_weight
    a bool. (add_rms_norm_reference itself does not call this: its contract is unchanged, any offset its
    arithmetic accepts.)
    """
    if isinstance(offset, bool) or not isinstance(offset, numbers.Real) or not math.isfinite(offset):
        raise ValueError(f"{op}: offset must be a finite Python float, got {offset!r}")
    if not isinstance(float32_weight, bool):
        raise TypeError(f"{op}: float32_weight must be a bool, got {float32_weight!r}")


def check_silu_and_mul_args(x: torch.Tensor, *, op: str = "silu_and_mul") -> None:
    _check_dtype(op, "x", x)
    if x.dim() < 1 or x.shape[-1] < 2 or x.shape[-1] % 2:
        raise ValueError(f"{op}: x must have shape [..., 2*I] with an even last dim >= 2, got {tuple(x.shape)}")


def add_rms_norm_reference(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    offset: float = 0.0,
    float32_weight: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of `x` (or of `x + residual`), exactly as an unfused Hugging Face model of the family computes it.

    residual None: returns out = (offset + weight) * to_dtype(fp32(x) * rsqrt(mean(fp32(x)^2) + eps)), the
    weight multiply in the activation dtype after the cast, like Qwen3RMSNorm / LlamaRMSNorm (offset 0).
    float32_weight: out = to_dtype(fp32(x) * rsqrt(...) * (offset + fp32(weight))), the multiply in float32
    before the one cast, like Gemma2RMSNorm (offset 1: the weight is stored as w, applied as 1 + w) and
    Olmo2RMSNorm (offset 0).
    residual given: s = to_dtype(fp32(x) + fp32(residual)) is the new residual; returns (out of s, s).
    """
    check_add_rms_norm_args(x, residual, weight, eps, op="add_rms_norm_reference")
    if residual is not None:
        # Rounded to the activation dtype: that is the tensor an unfused model would store as x1/x2.
        x = (x.float() + residual.float()).to(x.dtype)
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)  # [..., 1]
    normed = xf * torch.rsqrt(variance + eps)  # [..., H] float32
    if float32_weight:
        out = (normed * (offset + weight.float())).to(x.dtype)
    else:
        out = (offset + weight if offset else weight) * normed.to(x.dtype)
    return out if residual is None else (out, x)


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation on a merged [..., 2I] input (gate first): to_dtype(silu(fp32 gate) * fp32 up)."""
    check_silu_and_mul_args(x, op="silu_and_mul_reference")
    gate, up = x.float().chunk(2, dim=-1)  # [..., I] each
    return (F.silu(gate) * up).to(x.dtype)


def gelu_tanh_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """GeGLU's activation on a merged [..., 2I] input (gate first), GELU with the tanh approximation (Gemma's
    gelu_pytorch_tanh): to_dtype(gelu_tanh(fp32 gate) * fp32 up), the same single rounding as silu_and_mul."""
    check_silu_and_mul_args(x, op="gelu_tanh_and_mul_reference")
    gate, up = x.float().chunk(2, dim=-1)  # [..., I] each
    return (F.gelu(gate, approximate="tanh") * up).to(x.dtype)
