"""JAX launcher of generation's attention over the KV cache (kernels/cpu/attend.c, bound to XLA by
decode_ops_ffi.cc): `attend(q, k, v, mask, scale, softcap, keys)`, the twin of torch_decode_ops.attend.

The reference (jax_impl/attention.py's `attend`) attends over every slot of the preallocated cache, the unwritten
ones zeroed and masked, so a decode step reads the whole buffer, and XLA:CPU runs its two small batched products
and the zeroing as separate passes over it, each layer. This call reads the keys and values of the slots written
so far (`keys`, the cache's length after the step's write) once, in place, with the same arithmetic as the
reference (scores, softmax and the weighted sum in float32, one rounding; tests/kernels/test_jax_decode_ops.py
holds it to the kernel tolerance table's "attention" rows). A custom call inside the jitted step
(jax.ffi.ffi_call); not differentiable: jax_impl takes it only in generation. A prompt's many query steps run
attend.c's blocked kernel (small matrix products, keys past a row's causal end skipped), which beats XLA's batched
products and the transposes around them.

Beside it, `write_cache`: a full layer's cache write (decode_ops_ffi.cc's CacheWrite), bit for bit the
dynamic_update_slice it stands for, touching only the new slots of the donated buffers; jax_impl/kv_cache.py takes it
where `writes` says (the same contexts as `takes`).

`takes` is the rule, as torch_decode_ops' is: inside `decode_steps()` (jax_impl/generate.py enters it while it
traces its decode step: one token per row, at most MAX_ROWS rows) or `prompts()` (while it traces its prompt: any
rows), not `reference_only()`, float32 or bfloat16 operands of one dtype, the CPU backend with no mesh, the kernel
built. The flags are read while tracing: a compiled step keeps what it was traced with, so generate keys its
compiled steps on `enabled()`.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels.cpu import build
from kernels.cpu.switch import Switch

MAX_ROWS = 8  # the most batch rows of a decode step that take the kernel (torch_decode_ops.MAX_ROWS)
_TARGETS = {"float32": "AttendF32", "bfloat16": "AttendBF16"}
_WRITES = {"float32": "CacheWriteF32", "bfloat16": "CacheWriteBF16"}
_DECODING = Switch("jax_decode_ops.decoding")
_PROMPT = Switch("jax_decode_ops.prompt")
_OFF = Switch("jax_decode_ops.off")


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered with XLA here (kernels.cpu.build.unavailable("decode_ops_xla"):
    why not). Registration happens once per process."""
    lib = build.load("decode_ops_xla", (jax.ffi.include_dir(),))
    if lib is None:
        return False
    for symbol in (*_TARGETS.values(), *_WRITES.values()):
        jax.ffi.register_ffi_target(_target(symbol), jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    return True


def _target(symbol: str) -> str:
    return f"decoder_parity_{symbol}"


def decode_steps() -> contextlib.AbstractContextManager[None]:
    """Within the block (this thread, while tracing) the layers may take the kernel: jax_impl/generate.py enters it
    around its decode step only, so no other forward (a prompt, a parity trace, training) changes what it computes."""
    return _DECODING.on()


def prompts() -> contextlib.AbstractContextManager[None]:
    """Within the block (this thread, while tracing) the layers may take the kernel for a prompt's rows:
    jax_impl/generate.py enters it around its prompt's forward."""
    return _PROMPT.on()


def reference_only() -> contextlib.AbstractContextManager[None]:
    """Within the block every layer keeps the reference, prompts and decode steps included (this thread):
    side-by-side runs."""
    return _OFF.on()


def enabled() -> bool:
    """Whether `reference_only()` leaves the kernel allowed here: part of a compiled decode step's key."""
    return not _OFF.get()


def decoding() -> bool:
    """Inside `decode_steps()` and not `reference_only()`: where generation's decode step may take the CPU kernels
    (this one, and jax_decode_layer's whole layer)."""
    return _DECODING.get() and not _OFF.get()


def takes(q: jax.Array, k: jax.Array, v: jax.Array) -> bool:
    """Whether a layer attends with the kernel: q [B, 1, n_kv, g, d] with 0 < B <= MAX_ROWS inside `decode_steps()`,
    or q [B, T, n_kv, g, d] inside `prompts()`, not `reference_only()`, k and v of q's dtype (float32 or bfloat16),
    the CPU backend with no mesh (under one the partitioner owns the layout), the kernel built."""
    dtype = jnp.dtype(q.dtype)
    step = decoding() and q.ndim == 5 and q.shape[1] == 1 and 0 < q.shape[0] <= MAX_ROWS
    return (
        (step or (_prompting() and q.ndim == 5))
        and dtype.name in _TARGETS
        and k.dtype == dtype
        and v.dtype == dtype
        and _unsharded_cpu()
    )


def _prompting() -> bool:
    """Inside `prompts()` and not `reference_only()`."""
    return _PROMPT.get() and not _OFF.get()


def _unsharded_cpu() -> bool:
    """The CPU backend with no mesh (under one the partitioner owns the layout), the kernel built."""
    return jax.default_backend() == "cpu" and jax.sharding.get_abstract_mesh().empty and available()


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    scale: float,
    softcap: float | None = None,
    keys: jax.Array | int | None = None,
) -> jax.Array:
    """jax_impl.attention.attend's result over the first `keys` slots (None: all S): q [B, T, n_kv, g, d] (grouped),
    k [B, n_kv, S, d], v [B, n_kv, d, S], mask [B, T, S] bool (True = may attend) -> [B, T, n_kv, g, d] in q's
    dtype. Slots at or past `keys` are never read (they may hold anything); a query with no allowed slot among the
    first `keys` gets their plain mean, as the reference does for a fully masked row over the slots it is given.
    A ValueError names the operands that do not fit."""
    b, t, n_kv, g, d = q.shape if q.ndim == 5 else (None,) * 5
    s = k.shape[2] if k.ndim == 4 else None
    dtype = jnp.dtype(q.dtype)
    if not (
        q.ndim == 5
        and k.shape == (b, n_kv, s, d)
        and v.shape == (b, n_kv, d, s)
        and mask.shape == (b, t, s)
        and mask.dtype == jnp.bool_
        and dtype.name in _TARGETS
        and k.dtype == dtype
        and v.dtype == dtype
    ):
        got = f"q {q.shape} {q.dtype}, k {k.shape} {k.dtype}, v {v.shape} {v.dtype}, mask {mask.shape} {mask.dtype}"
        raise ValueError(
            "kernels.cpu attend: needs q [B, T, n_kv, g, d], k [B, n_kv, S, d], v [B, n_kv, d, S] of one dtype "
            f"(float32 or bfloat16) and mask [B, T, S] bool; got {got}"
        )
    _require_kernel("attend")
    call = jax.ffi.ffi_call(
        _target(_TARGETS[dtype.name]), jax.ShapeDtypeStruct(q.shape, dtype), vmap_method="sequential"
    )
    keys = jnp.asarray(s if keys is None else keys, jnp.int32)  # [] int32: the slots read
    return call(q, k, v, mask, keys, scale=np.float32(scale), cap=np.float32(softcap or 0.0))


def writes(cache_k: jax.Array, k: jax.Array) -> bool:
    """Whether a full layer's cache write takes `write_cache`: inside `decode_steps()` or `prompts()`, not
    `reference_only()`, k of the buffer's dtype (float32 or bfloat16), the CPU backend with no mesh, the kernel
    built."""
    return (
        (decoding() or _prompting())
        and jnp.dtype(cache_k.dtype).name in _WRITES
        and k.dtype == cache_k.dtype
        and _unsharded_cpu()
    )


def write_cache(
    cache_k: jax.Array, cache_v: jax.Array, k: jax.Array, v: jax.Array, start: jax.Array | int
) -> tuple[jax.Array, jax.Array]:
    """dynamic_update_slice's result for k [B, n_kv, T, d] at slot `start` of cache_k [B, n_kv, S, d] and v
    [B, n_kv, d, T] at slot `start` of cache_v [B, n_kv, d, S] (start clamped to [0, S - T] as it clamps), written in
    place where the buffers are donated: only the new slots are touched. A ValueError names operands that do not
    fit."""
    b, n_kv, s, d = cache_k.shape if cache_k.ndim == 4 else (None,) * 4
    t = k.shape[2] if k.ndim == 4 else None
    dtype = jnp.dtype(cache_k.dtype)
    if not (
        cache_k.ndim == 4
        and cache_v.shape == (b, n_kv, d, s)
        and k.shape == (b, n_kv, t, d)
        and v.shape == (b, n_kv, d, t)
        and t <= s
        and dtype.name in _WRITES
        and cache_v.dtype == k.dtype == v.dtype == dtype
    ):
        got = f"cache_k {cache_k.shape} {cache_k.dtype}, cache_v {cache_v.shape} {cache_v.dtype}, k {k.shape} {k.dtype}"
        raise ValueError(
            "kernels.cpu write_cache: needs cache_k [B, n_kv, S, d], cache_v [B, n_kv, d, S], k [B, n_kv, T, d] and "
            f"v [B, n_kv, d, T] of one dtype (float32 or bfloat16), T <= S; got {got}, v {v.shape} {v.dtype}"
        )
    _require_kernel("write_cache")
    call = jax.ffi.ffi_call(
        _target(_WRITES[dtype.name]),
        (jax.ShapeDtypeStruct(cache_k.shape, dtype), jax.ShapeDtypeStruct(cache_v.shape, dtype)),
        input_output_aliases={0: 0, 1: 1},
        vmap_method="sequential",
    )
    return call(cache_k, cache_v, k, v, jnp.asarray(start, jnp.int32))


def _require_kernel(what: str) -> None:
    """A ValueError naming `what` unless the CPU backend runs here with the kernel built."""
    if not (jax.default_backend() == "cpu" and available()):
        raise ValueError(
            f"kernels.cpu {what}: runs on the CPU backend with the kernel built (backend {jax.default_backend()}; "
            f"{build.unavailable('decode_ops_xla') or 'built'})"
        )
