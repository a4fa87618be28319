"""Fused kernels for both backends, and the one switch that picks between them.

Each fused op has one contract and three implementations: a reference in plain framework ops, a Triton
kernel for PyTorch (kernels/triton/), a Pallas kernel for JAX (kernels/pallas/). This module is
framework-neutral on purpose: it imports neither torch nor jax, so that `spec`-level code and both
backends can resolve the `kernels=` argument without pulling in the other framework.
"""

from __future__ import annotations

from spec.errors import InputError

KERNEL_CHOICES = ("reference", "fused", "auto")

__all__ = ["KERNEL_CHOICES", "resolve_kernels"]


def resolve_kernels(choice: str, *, on_gpu: bool) -> str:
    """Turn a user's `kernels=` argument into "reference" or "fused".

    "auto" means fused on a GPU and reference on CPU: on CPU the fused kernels only run in interpret
    mode (TRITON_INTERPRET=1 / Pallas interpret=True), which is correct but orders of magnitude slower,
    so it is something to ask for explicitly ("fused"), never a default.
    """
    if choice not in KERNEL_CHOICES:
        raise InputError(f"kernels={choice!r} is not one of {KERNEL_CHOICES}")
    if choice == "auto":
        return "fused" if on_gpu else "reference"
    return choice
