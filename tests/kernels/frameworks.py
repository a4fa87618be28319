"""Triton (torch) and Pallas (JAX) behind one interface, so that one test body runs on both kernel frameworks.

`framework("triton")` / `framework("pallas")` skips the calling test (or module) where that framework is not
installed. Inputs are built from float32 numpy (tests/kernels/tolerances.py: `sample_inputs`) and results
read back with tests/backends.py's `to_numpy`, so both frameworks see the same values.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pytest

FRAMEWORKS = ("triton", "pallas")
DTYPES = ("float32", "bfloat16", "float16")  # what the kernels accept
EPS = 1e-6
# Row widths of real models (not powers of two) and around them; test_cross_kernels.py repeats them so that
# the interpreted Pallas kernels compile once per shape for both files.
WIDTHS = (1, 123, 1000, 896, 1024, 1536, 3072)


@dataclass(frozen=True)
class Framework:
    name: str  # "triton" | "pallas": kernels.<name> holds the fused ops, their references and the kernel modules
    array: Callable[[np.ndarray, str], Any]  # float32 numpy -> the framework's array of that dtype, on its device
    dtype_prefix: str  # how an error message spells a dtype: "torch.float16" or "float16"
    # (fn, primals, cotangents) -> the primals' gradients (None for a None primal): torch autograd on fresh
    # leaves, or jax.vjp. A tuple of outputs takes a tuple of cotangents, one output one cotangent.
    vjp: Callable[[Callable, tuple, Any], tuple]
    # How the tests compute expected values with the references. JAX: under jit, one XLA compile per shape
    # instead of one per op, which is most of the run time otherwise (jax_impl runs them jitted too).
    jit: Callable[..., Callable] = lambda fn, **_: fn

    @property
    def ops(self) -> ModuleType:
        """kernels.triton / kernels.pallas: the fused ops and their references, as a user imports them."""
        return importlib.import_module(f"kernels.{self.name}")

    @property
    def rms_norm(self) -> ModuleType:
        """The module of add_rms_norm's kernel (its block configuration)."""
        return importlib.import_module(f"kernels.{self.name}.rms_norm")

    @property
    def swiglu(self) -> ModuleType:
        """The module of silu_and_mul's kernel."""
        return importlib.import_module(f"kernels.{self.name}.swiglu")

    @property
    def rms_norm_backward(self) -> ModuleType:
        """The module of add_rms_norm's backward kernels (their block configuration)."""
        return importlib.import_module(f"kernels.{self.name}.rms_norm_backward")

    @property
    def swiglu_backward(self) -> ModuleType:
        """The module of silu_and_mul's backward kernel."""
        return importlib.import_module(f"kernels.{self.name}.swiglu_backward")

    @property
    def add_rms_norm(self) -> Callable:
        return self.ops.add_rms_norm

    @property
    def silu_and_mul(self) -> Callable:
        return self.ops.silu_and_mul

    def gated(self, activation: str, fused: bool = True) -> Callable:
        """The gated op of `activation` ("silu" | "gelu_tanh"): fused, or its reference (jitted in JAX)."""
        name = {"silu": "silu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}[activation]
        return getattr(self.ops, name) if fused else self._jitted(f"{name}_reference")

    def add_rms_norm_reference_with(self, offset: float = 0.0, float32_weight: bool = False) -> Callable:
        """add_rms_norm_reference with the family options bound (jitted in JAX, one compile per option set)."""
        key = ("add_rms_norm_reference", offset, float32_weight)
        if key not in self._cache:
            fn = functools.partial(self.ops.add_rms_norm_reference, offset=offset, float32_weight=float32_weight)
            self._cache[key] = self.jit(fn, static_argnums=3)  # eps is a Python float
        return self._cache[key]

    @functools.cached_property
    def _cache(self) -> dict:
        """Jitted functions by (name, options...): built once per framework and option set."""
        return {}

    def _jitted(self, name: str) -> Callable:
        if name not in self._cache:
            self._cache[name] = self.jit(getattr(self.ops, name))
        return self._cache[name]

    @functools.cached_property
    def add_rms_norm_reference(self) -> Callable:
        return self.jit(self.ops.add_rms_norm_reference, static_argnums=3)  # eps is a Python float

    @functools.cached_property
    def silu_and_mul_reference(self) -> Callable:
        return self.jit(self.ops.silu_and_mul_reference)

    def add_rms_norm_grads(
        self, fused: bool, x: Any, residual: Any, weight: Any, d_out: Any, d_new_residual: Any, **options: Any
    ):
        """(d_x, d_residual or None, d_weight) of the fused op (fused=True) or of the reference (jitted in JAX).

        options: add_rms_norm's family options (offset, float32_weight); none: the cached plain functions."""
        if not options:
            grads = self._add_rms_norm_fused_grads if fused else self._add_rms_norm_reference_grads
            return grads(x, residual, weight, d_out, d_new_residual)
        key = ("add_rms_norm_grads", fused, *sorted(options.items()))
        if key not in self._cache:
            fn = self.ops.add_rms_norm if fused else self.ops.add_rms_norm_reference
            self._cache[key] = self.jit(self._rms_grads(functools.partial(fn, **options)))
        return self._cache[key](x, residual, weight, d_out, d_new_residual)

    def gated_grads(self, fused: bool, activation: str, x: Any, d_out: Any) -> Any:
        """d_x [..., 2I] of the gated op of `activation`, fused or the reference (jitted in JAX)."""
        if activation == "silu":
            return self.silu_and_mul_grads(fused, x, d_out)
        key = ("gated_grads", fused, activation)
        if key not in self._cache:
            fn = self.gated(activation, fused) if fused else self.ops.gelu_tanh_and_mul_reference
            self._cache[key] = self.jit(lambda x, d_out: self.vjp(fn, (x,), d_out)[0])
        return self._cache[key](x, d_out)

    def silu_and_mul_grads(self, fused: bool, x: Any, d_out: Any) -> Any:
        """d_x [..., 2I] of the fused op or of the reference (jitted in JAX)."""
        return (self._silu_and_mul_fused_grads if fused else self._silu_and_mul_reference_grads)(x, d_out)

    def _rms_grads(self, fn: Callable) -> Callable:
        def grads(x, residual, weight, d_out, d_new_residual):
            cotangents = d_out if residual is None else (d_out, d_new_residual)
            return self.vjp(lambda x, r, w: fn(x, r, w, EPS), (x, residual, weight), cotangents)

        return grads

    # The fused gradients run under jit too (JAX): one compile of forward and backward kernels per shape, the
    # way a jitted training step runs them; test_pallas_kernels.py covers the eager custom_vjp.
    @functools.cached_property
    def _add_rms_norm_fused_grads(self) -> Callable:
        return self.jit(self._rms_grads(self.ops.add_rms_norm))

    @functools.cached_property
    def _add_rms_norm_reference_grads(self) -> Callable:
        return self.jit(self._rms_grads(self.ops.add_rms_norm_reference))

    @functools.cached_property
    def _silu_and_mul_fused_grads(self) -> Callable:
        return self.jit(lambda x, d_out: self.vjp(self.ops.silu_and_mul, (x,), d_out)[0])

    @functools.cached_property
    def _silu_and_mul_reference_grads(self) -> Callable:
        return self.jit(lambda x, d_out: self.vjp(self.ops.silu_and_mul_reference, (x,), d_out)[0])


def _triton() -> Framework:
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def array(a: np.ndarray, dtype: str) -> Any:
        return torch.from_numpy(a).to(device=device, dtype=getattr(torch, dtype))

    def vjp(fn: Callable, primals: tuple, cotangents: Any) -> tuple:
        leaves = [p.detach().clone().requires_grad_() if p is not None else None for p in primals]
        outs = fn(*leaves)
        torch.autograd.backward(outs, cotangents)
        return tuple(leaf.grad if leaf is not None else None for leaf in leaves)

    return Framework("triton", array, "torch.", vjp)


def _pallas() -> Framework:
    jax = pytest.importorskip("jax")

    # The cast happens in numpy (ml_dtypes rounds to nearest-even, like torch and XLA): an eager jnp cast
    # would cost an XLA compile per shape.
    def array(a: np.ndarray, dtype: str) -> Any:
        return jax.numpy.asarray(a.astype(jax.numpy.dtype(dtype)))

    def vjp(fn: Callable, primals: tuple, cotangents: Any) -> tuple:
        return jax.vjp(fn, *primals)[1](cotangents)

    return Framework("pallas", array, "", vjp, jit=jax.jit)


@functools.cache
def framework(name: str) -> Framework:
    """The framework called `name` ("triton" or "pallas"); skips the caller where it is not installed."""
    return {"triton": _triton, "pallas": _pallas}[name]()
