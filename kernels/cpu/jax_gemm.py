"""JAX launcher of the CPU many-row products (kernels/cpu/gemm.c for float32 on AVX-512; for bfloat16 gemm_amx.c on
AMX, else gemm_dpbf16.c on AVX512_BF16; bound to XLA by gemm_ffi.cc, gemm_amx_ffi.cc and gemm_dpbf16_ffi.cc):
`gemm(x, w)`; and `upcast(x, w)`, a bfloat16 product computed in float32 by gemm.c's loops (UPCAST).

jax_impl/linear.py offers it as the form "gemm" beside the single dot for the products of more than a decode step's
rows (a prompt's, a training step's forward), chosen by measurement. x [rows, in] @ W [in, out] (Flax's kernel
layout), both float32 or both bfloat16, the float32 result returned for the caller to round once. Each dtype has its
libraries, each built only where the processor has what it is compiled for (kernels.cpu.build.ISA): an AVX-512
processor without AVX512_BF16 has the float32 one alone. Where bfloat16 has two, AMX's is taken: one tile
instruction does 16 x 16 x 32 multiply-adds where vdpbf16ps does 16 x 2, and AMX's kernel was measured above the
rate vdpbf16ps can reach on those cores at all (docs/benchmarks.md); vdpbf16ps is for processors without tiles (AMD
Zen 4, Intel Cooper Lake). Whether vdpbf16ps beats the float32 FMAs depends on the core, not on a flag (on an Intel
Xeon without AMX exposed it ran below them: docs/benchmarks.md), so jax_impl/linear.py offers `upcast` as a form of
its own beside `gemm` and times the two (kernels/cpu/torch_gemm.py's `upcast` is its twin: the same loops on
nn.Linear's layout). Each is a custom call inside a jitted program (jax.ffi.ffi_call),
differentiable: its backward is the two plain products (jax_gemv.backward). CPU only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels.cpu import build
from kernels.cpu.jax_gemv import backward

LIBRARIES = {  # per dtype, (library, symbol) in order of preference (the docstring says why): the first built is used
    "float32": (("gemm_xla", "GemmF32"),),
    "bfloat16": (("gemm_amx_xla", "GemmAmxBF16"), ("gemm_dpbf16_xla", "GemmDpBF16")),
}
UPCAST = ("gemm_xla", "GemmBF16F32")  # bfloat16 operands widened to float32 as gemm.c packs them: AVX-512F alone
_refused: dict[str, str] = {}  # per library


def library(dtype: str) -> tuple[str, str] | None:
    """The (library, symbol) of `dtype` ("float32", "bfloat16") built and registered with XLA here, the first of
    LIBRARIES[dtype] that is, or None (`unavailable`: why)."""
    return next(((name, symbol) for name, symbol in LIBRARIES[dtype] if _registered(name, symbol)), None)


@functools.cache
def _registered(name: str, symbol: str) -> bool:
    """Build `name` and register its handler `symbol` with XLA, once per process (for AMX, after Linux's grant of the
    tile state)."""
    lib = build.load(name, (jax.ffi.include_dir(),))
    if lib is None:
        return False
    if name == "gemm_amx_xla" and (err := lib.gemm_amx_permit()) != 0:
        _refused[name] = f"Linux refused the AMX tile state (arch_prctl returned {err})"
        return False
    jax.ffi.register_ffi_target(_target(symbol), jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    return True


def available(dtype: str) -> bool:
    """Whether a kernel for `dtype` is built and registered with XLA here (`library` says which)."""
    return library(dtype) is not None


def unavailable(dtype: str) -> str | None:
    """Why no kernel for `dtype` is available in this process, each library's reason, or None (available, or not asked
    for yet)."""
    reasons = [(name, _refused.get(name) or build.unavailable(name)) for name, _ in LIBRARIES[dtype]]
    return "; ".join(f"{name}: {why}" for name, why in reasons if why) or None


def _target(symbol: str) -> str:
    return f"decoder_parity_{symbol}"


def _fits(x: jax.Array, w: jax.Array) -> bool:
    """x [rows, in] and w [in, out] of one dtype, rows and in >= 1, on the CPU: what every entry here takes."""
    return (
        x.ndim == 2
        and w.ndim == 2
        and x.shape[0] > 0
        and x.shape[1] == w.shape[0] > 0
        and x.dtype == w.dtype
        and jax.default_backend() == "cpu"
    )


def supports(x: jax.Array, w: jax.Array) -> bool:
    """x [rows, in] and w [in, out] of one dtype with a kernel here (LIBRARIES), in >= 1, on the CPU."""
    dtype = jnp.dtype(x.dtype).name
    return _fits(x, w) and dtype in LIBRARIES and available(dtype)


def upcast_available() -> bool:
    """Whether gemm.c's bfloat16 entry (UPCAST) is built and registered with XLA here."""
    return _registered(*UPCAST)


def supports_upcast(x: jax.Array, w: jax.Array) -> bool:
    """x [rows, in] and w [in, out] both bfloat16, in >= 1, on the CPU, with gemm.c built here (UPCAST)."""
    return _fits(x, w) and x.dtype == jnp.bfloat16 and upcast_available()


def gemm(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [rows, in] @ w [in, out] -> [rows, out] float32; a ValueError naming the operands where `supports` does not
    hold."""
    if not supports(x, w):
        dtype = jnp.dtype(x.dtype).name
        why = (unavailable(dtype) or "built") if dtype in LIBRARIES else "no kernel for this dtype"
        raise ValueError(
            f"gemm: x {x.shape} {x.dtype}, w {w.shape} {w.dtype}: needs x [rows, in] and w [in, out] of one dtype "
            f"among {sorted(LIBRARIES)}, on the CPU, with its kernel built ({why})"
        )
    return _product(library(jnp.dtype(x.dtype).name)[1], x, w)


def upcast(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [rows, in] @ w [in, out] -> [rows, out] float32 for bfloat16 operands, computed in float32 (bit for bit
    `gemm` of their float32 copies); a ValueError naming the operands where `supports_upcast` does not hold."""
    if not supports_upcast(x, w):
        why = _refused.get(UPCAST[0]) or build.unavailable(UPCAST[0]) or "built"
        raise ValueError(
            f"upcast: x {x.shape} {x.dtype}, w {w.shape} {w.dtype}: needs x [rows, in] and w [in, out], both "
            f"bfloat16, on the CPU, with gemm.c built ({why})"
        )
    return _product(UPCAST[1], x, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _product(symbol: str, x: jax.Array, w: jax.Array) -> jax.Array:
    call = jax.ffi.ffi_call(
        _target(symbol),
        jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32),  # [rows, out]
        vmap_method="sequential",
    )
    return call(x, w)


def _forward(symbol: str, x: jax.Array, w: jax.Array):
    return _product(symbol, x, w), (x, w)


def _backward(_symbol: str, saved, g: jax.Array):
    return backward("cols", saved, g)


_product.defvjp(_forward, _backward)
