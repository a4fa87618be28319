"""Pallas kernels for the JAX backend (the twin of kernels/triton/).

The references are imported eagerly; the fused kernels lazily (module `__getattr__`), so that
`import kernels.pallas.reference` -- which jax_impl does on every path -- never imports jax.experimental.pallas.

Interpret or compile is decided per call from the device the inputs live on (`resolve_interpret`; inside a
jax.jit, where inputs are tracers, from the platform the computation is lowered for: `run_on_platform`):
interpreted on CPU (so CI runs the very kernel source a GPU compiles), compiled through Pallas' Triton
lowering on CUDA/ROCm GPUs. No environment variable is involved.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
from jax import lax

from kernels.pallas.reference import add_rms_norm_reference, gelu_tanh_and_mul_reference, silu_and_mul_reference

if TYPE_CHECKING:
    from kernels.pallas.rms_norm import add_rms_norm
    from kernels.pallas.swiglu import gelu_tanh_and_mul, silu_and_mul

__all__ = [
    "add_rms_norm",
    "add_rms_norm_reference",
    "gelu_tanh_and_mul",
    "gelu_tanh_and_mul_reference",
    "silu_and_mul",
    "silu_and_mul_reference",
]

_LAZY = {
    "add_rms_norm": "kernels.pallas.rms_norm",
    "silu_and_mul": "kernels.pallas.swiglu",
    "gelu_tanh_and_mul": "kernels.pallas.swiglu",  # one gated kernel, the activation a static choice
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)  # modules rms_norm / swiglu: no shadowing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The widest row one program holds (add_rms_norm forward and backward); as in the Triton twin, see there.
MAX_BLOCK_H = 65536

# Interpret mode is a correctness tool, and the XLA compile of its emulation loop dominates CPU test time:
# LLVM at -O0 cuts that compile by about a third. (Inside a caller's jax.jit the caller's options apply.)
INTERPRET_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


def resolve_interpret(x: jax.Array, interpret: bool | None) -> bool | None:
    """interpret=True/False if known now: forced by the caller, or from the device of a concrete `x`.

    None for tracers (inside jax.jit): their device is unknown while tracing, so `run_on_platform` decides.
    """
    if interpret is not None or isinstance(x, jax.core.Tracer):
        return interpret
    devices = x.devices() if isinstance(x, jax.Array) else jax.devices()[:1]  # numpy input: the default device
    platforms = {device.platform for device in devices}
    if platforms == {"cpu"}:
        return True
    if platforms <= {"gpu", "cuda", "rocm"}:
        return False
    raise NotImplementedError(
        f"Pallas kernels here run interpreted on CPU or compiled on GPU (Triton); the input is on {sorted(platforms)}: "
        "use kernels='reference'"
    )


def run_on_platform(make_call: Callable[[bool], Callable[..., Any]], *args: Any, interpret: bool | None) -> Any:
    """Run `make_call(interpret)(*args)`: interpreted on CPU, compiled on GPU, unless `interpret` forces it.

    With interpret=None the choice is made by lax.platform_dependent when the computation is lowered, i.e.
    from the device the inputs (or the enclosing jax.jit) run on -- which also works on tracers, whose
    device is unknown while tracing. Other platforms (TPU) are refused there: these kernels use the GPU
    (Triton) dialect of Pallas.
    """
    if interpret is not None:
        return make_call(interpret)(*args)
    return lax.platform_dependent(*args, cpu=make_call(True), cuda=make_call(False), rocm=make_call(False))
