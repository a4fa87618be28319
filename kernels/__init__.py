"""Fused kernels for both backends, and the one switch that picks between them.

Each fused op has one contract and three implementations: a reference in plain framework ops, a Triton
kernel for PyTorch (kernels/triton/), a Pallas kernel for JAX (kernels/pallas/). This module is
framework-neutral on purpose: it imports neither torch nor jax, so that `spec`-level code and both
backends can resolve the `kernels=` argument without pulling in the other framework.
"""

from __future__ import annotations

from pathlib import Path

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


def _submodule(name: str) -> bool:
    return any((Path(root) / name).is_dir() or (Path(root) / f"{name}.py").is_file() for root in __path__)


def __getattr__(name: str) -> object:
    """A name this package lacks. Where Hugging Face's `kernels` distribution is installed too, the name is probably
    one of its own: both are imported as `kernels`, and this package shadows it (transformers 5.25 and later import it
    on loading any model), so say so instead of a bare "cannot import name"."""
    from importlib import metadata  # here, not at import: only a missing name needs it

    if name.startswith("__") or _submodule(name):  # the import system asks before it imports `from kernels import cpu`
        raise AttributeError(name)
    try:
        other = metadata.version("kernels")
    except metadata.PackageNotFoundError:
        raise AttributeError(f"module 'kernels' (decoder-parity's) has no attribute {name!r}") from None
    raise ImportError(
        f"kernels.{name}: `kernels` here is decoder-parity's package, which shadows Hugging Face's `kernels` "
        f"{other} (installed too: transformers 5.25 and later require it). decoder-parity supports transformers<5.25 "
        "(its hf extra pins that): `pip install 'transformers<5.25' && pip uninstall kernels`"
    )
