"""JAX launcher of the CPU few-row product (kernels/cpu/gemv.c, bound to XLA by gemv_ffi.cc): `gemv(x, w, layout)`.

jax_impl/linear.py offers it as the form "gemv" beside the single dot and the split contraction, chosen by
measurement. `layout` is "cols" for Flax's kernel W [in, out] (x @ W) and "rows" for W [out, in] (x @ W^T, a tied
head's table). The weight is float32 or bfloat16, x is taken in float32 and the float32 result is returned for
the caller to round once. A custom call inside a jitted program (jax.ffi.ffi_call), differentiable: its
backward is the two plain products (dx = g W^T, dW = x^T g), as the single dot's would be. CPU only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels.cpu import build, gemv_fetch

MAX_ROWS = 8  # gemv.c's MAX_ROWS
LAYOUTS = ("rows", "cols")
_TARGETS = {
    ("rows", "float32"): "GemvRowsF32",
    ("rows", "bfloat16"): "GemvRowsBF16",
    ("cols", "float32"): "GemvColsF32",
    ("cols", "bfloat16"): "GemvColsBF16",
}


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered with XLA here (kernels.cpu.build.unavailable("gemv_xla"): why
    not). Registration happens once per process."""
    lib = build.load("gemv_xla", (jax.ffi.include_dir(),))
    if lib is None:
        return False
    if lib.gemv_max_rows() != MAX_ROWS:  # the same check as torch_gemv's
        raise RuntimeError(f"kernels/cpu/gemv.c MAX_ROWS {lib.gemv_max_rows()} != jax_gemv.MAX_ROWS {MAX_ROWS}")
    for symbol in _TARGETS.values():
        jax.ffi.register_ffi_target(_target(symbol), jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    return True


def _target(symbol: str) -> str:
    return f"decoder_parity_{symbol}"


def supports(x: jax.Array, w: jax.Array, layout: str) -> bool:
    """x [rows <= MAX_ROWS, in], w [out, in] ("rows") or [in, out] ("cols") in float32 or bfloat16, on the CPU."""
    return (
        layout in LAYOUTS
        and x.ndim == 2
        and w.ndim == 2
        and 0 < x.shape[0] <= MAX_ROWS
        and x.shape[1] == w.shape[1 if layout == "rows" else 0]
        and jnp.dtype(w.dtype).name in ("float32", "bfloat16")
        and jax.default_backend() == "cpu"
        and available()
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def gemv(x: jax.Array, w: jax.Array, layout: str) -> jax.Array:
    """x [rows, in] @ W -> [rows, out] float32; a ValueError naming the operands where `supports` does not hold."""
    if not supports(x, w, layout):
        raise ValueError(
            f"gemv: x {x.shape} {x.dtype}, w {w.shape} {w.dtype}, layout {layout!r}: needs x [rows <= {MAX_ROWS}, in] "
            f"and w [out, in] ('rows') or [in, out] ('cols') in float32 or bfloat16 on the CPU (kernel available: "
            f"{available()}; {build.unavailable('gemv_xla') or 'built'})"
        )
    out = w.shape[0] if layout == "rows" else w.shape[1]
    call = jax.ffi.ffi_call(
        _target(_TARGETS[layout, jnp.dtype(w.dtype).name]),
        jax.ShapeDtypeStruct((x.shape[0], out), jnp.float32),  # [rows, out]
        vmap_method="sequential",
    )
    fetch = gemv_fetch.fetch(jnp.dtype(w.dtype).name, layout)  # chosen at the first trace of each pair
    return call(x.astype(jnp.float32), w, fetch=np.int32(fetch))


def _forward(x: jax.Array, w: jax.Array, layout: str):
    return gemv(x, w, layout), (x, w)


def backward(layout: str, saved, g: jax.Array):
    """(dx, dW) of y = x @ W ("cols", W [in, out]) or x @ W^T ("rows", W [out, in]) for the output gradient g: the
    two plain products at full precision, as the single dot's backward would be; jax_gemm.py shares it."""
    x, w = saved
    w32 = w.astype(jnp.float32)
    hi = jax.lax.Precision.HIGHEST
    if layout == "rows":  # y = x W^T, W [out, in]
        dx, dw = jnp.dot(g, w32, precision=hi), jnp.dot(g.T, x.astype(jnp.float32), precision=hi)
    else:  # y = x W, W [in, out]
        dx, dw = jnp.dot(g, w32.T, precision=hi), jnp.dot(x.astype(jnp.float32).T, g, precision=hi)
    return dx.astype(x.dtype), dw.astype(w.dtype)


gemv.defvjp(_forward, backward)
