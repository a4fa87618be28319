"""Triton kernels for the PyTorch backend (the twin of kernels/pallas/).

The references are imported eagerly; the fused kernels lazily (module `__getattr__`), so that
`import kernels.triton.reference` -- which torch_impl does on every path -- never imports triton.

Triton decides between compiling and interpreting when a kernel module is *imported* (`@triton.jit` reads
TRITON_INTERPRET then), so on a machine without a GPU set TRITON_INTERPRET=1 before the first access to
`kernels.triton.add_rms_norm` / `silu_and_mul` / `gelu_tanh_and_mul`. Calling a kernel on CPU tensors without
it raises an error that says so.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kernels.triton.reference import add_rms_norm_reference, gelu_tanh_and_mul_reference, silu_and_mul_reference

if TYPE_CHECKING:
    import torch

    from kernels.triton.rms_norm import add_rms_norm
    from kernels.triton.swiglu import gelu_tanh_and_mul, silu_and_mul

__all__ = [
    "add_rms_norm",
    "add_rms_norm_reference",
    "gelu_tanh_and_mul",
    "gelu_tanh_and_mul_reference",
    "silu_and_mul",
    "silu_and_mul_reference",
]

_LAZY = {
    "add_rms_norm": "kernels.triton.rms_norm",
    "silu_and_mul": "kernels.triton.swiglu",
    "gelu_tanh_and_mul": "kernels.triton.swiglu",  # one gated kernel, the activation a compile-time choice
}

# A whole row lives in one program's registers (add_rms_norm's reduction needs all of it, forward and
# backward); past 64K elements that spills badly, so wider rows are refused rather than run slowly. Real
# models stay far below (<= 16K).
MAX_BLOCK_H = 65536


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)  # modules rms_norm / swiglu: no shadowing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_interpreted(kernel: Any) -> bool:
    """True when `kernel` was decorated while TRITON_INTERPRET=1 (it then runs on the CPU in numpy)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def check_launchable(op: str, kernel: Any, *tensors: torch.Tensor | None) -> None:
    """Raise before launching if the tensors cannot run `kernel`: mixed devices, or CPU without interpret mode."""
    devices = {t.device for t in tensors if t is not None}
    if len(devices) != 1:
        raise ValueError(f"{op}: all tensors must be on one device, got {sorted(str(d) for d in devices)}")
    device = devices.pop()
    if device.type == "cpu" and not is_interpreted(kernel):
        raise RuntimeError(
            f"{op}: got CPU tensors, but the Triton kernel was compiled for a GPU because TRITON_INTERPRET was not "
            "set when it was imported. Set TRITON_INTERPRET=1 in the environment before importing triton (and "
            "kernels.triton.*) to run it in interpret mode on CPU, or use kernels='reference'."
        )


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """View `t` [..., W] as [rows, W] with unit stride along W, copying only when no such view exists.

    The kernels take a row stride, so row-strided views (e.g. a column slice of a wider tensor) run without
    a copy; only a non-unit stride along the last dim (e.g. a transpose) forces `.contiguous()`.
    """
    rows = t.reshape(-1, t.shape[-1])  # [rows, W]
    return rows if rows.stride(-1) == 1 or rows.shape[-1] == 1 else rows.contiguous()


def grid_blocks(n: int, block: int) -> int:
    """Programs that cover `n` items `block` at a time: a ceiling by integer division. triton.cdiv is a constexpr
    function, slow to call on the host, and the launchers ask at every launch."""
    return -(-n // block)
