"""JAX launcher of a whole pre-norm decoder layer of a CPU decode step in one call (kernels/cpu/decode_layer.c, bound
to XLA by decode_layer_ffi.cc): `decode_layer(...)`, the twin of torch_decode_layer.decode_layer.

jax_impl/decoder_layer.py's DecoderLayer runs a dense layer's decode step through it inside generation's jitted
decode step where jax_impl/layer_choice.py's rule takes it (the kernel applies to all six products): the few-row
product kernel over Flax's [in, out] kernels (jax_impl/linear.py's "gemv" form) and the attention over the cache's
written slots that kernels/cpu/jax_decode_ops.py runs, with decode_ops.c's add+RMSNorm, q/k norms, RoPE and SwiGLU
in place of XLA's fusions of the reference's. Those agree with XLA's to float32 rounding, not bit for bit (another
summation order, another exp), so the tests hold a generation through it to the parity table's bound and to the
same greedy tokens. The layer's keys and values are written into the cache's buffers in place (the caches are
aliased operands); a custom call, not differentiable. `takes` is the rule; it and `enabled` are read while tracing,
so jax_impl/generate.py keys its compiled steps on `enabled()`.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels.cpu import build, decode_layer_operands, gemv_fetch, jax_decode_ops
from kernels.cpu.decode_layer_operands import LayerWeights
from kernels.cpu.switch import Switch

__all__ = ["LayerWeights", "available", "decode_layer", "enabled", "per_operator", "takes"]

_TARGET = "decoder_parity_DecodeLayerStep"
_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
_OFF = Switch("jax_decode_layer.off")
_OPERANDS = (  # the custom call's operands, in decode_layer_ffi.cc's Operand order
    "x", "residual", "input_norm", "post_norm", "q_norm", "k_norm", "wq", "wk", "wv", "wo", "wgu", "wd",
    "bq", "bk", "bv", "bo", "bgu", "bd", "cos", "sin", "k_cache", "v_cache", "mask", "pos",
)  # fmt: skip


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered with XLA here (kernels.cpu.build.unavailable("decode_layer_xla"):
    why not). Registration happens once per process."""
    lib = build.load("decode_layer_xla", (jax.ffi.include_dir(),))
    if lib is None:
        return False
    jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(lib.DecodeLayerStep), platform="cpu")
    return True


def per_operator() -> contextlib.AbstractContextManager[None]:
    """Within the block (this thread, while tracing) the layers keep their per-operator decode step: the tests' and
    the benchmark's side-by-side runs."""
    return _OFF.on()


def enabled() -> bool:
    """Outside `per_operator()`: part of a compiled decode step's key."""
    return not _OFF.get()


def takes(x: jax.Array, k_cache: jax.Array) -> bool:
    """Whether a layer's step may run in one call (its products' forms are the caller's to ask): x [B, 1, H] with
    0 < B <= MAX_ROWS in float32 or bfloat16 inside generation's decode steps (jax_decode_ops.decoding()), a cache
    of x's dtype, not `per_operator()`, the CPU backend with no mesh, the kernel built."""
    return (
        jax_decode_ops.decoding()
        and enabled()
        and x.ndim == 3
        and x.shape[1] == 1
        and 0 < x.shape[0] <= jax_decode_ops.MAX_ROWS
        and jnp.dtype(x.dtype) in _DTYPES
        and k_cache.dtype == x.dtype
        and jax.default_backend() == "cpu"
        and jax.sharding.get_abstract_mesh().empty
        and available()
    )


def _refuse(problem: str) -> ValueError:
    return ValueError(f"kernels.cpu decode_layer: {problem}")


def _check(x, residual, w: LayerWeights, cos, sin, k_cache, v_cache, mask, heads) -> None:
    """Every operand's dtype and shape against x [B, 1, H] and the cache's [B, n_kv, S, d] keys."""
    dtype = jnp.dtype(x.dtype)
    if dtype not in _DTYPES or x.ndim != 3 or x.shape[1] != 1:
        raise _refuse(f"x must be [B, 1, H] float32 or bfloat16; got {x.shape} {dtype}")
    b, _, hidden = x.shape
    if k_cache.ndim != 4 or k_cache.shape[0] != b:
        raise _refuse(f"k_cache must be [{b}, n_kv, S, d]; got {k_cache.shape}")
    kinds = {"act": dtype, "float32": jnp.dtype(jnp.float32), "bool": jnp.dtype(jnp.bool_)}
    operands = decode_layer_operands.expected(
        residual, w, cos, sin, k_cache, v_cache, mask, rows=b, hidden=hidden, heads=heads,
        mask_keys=k_cache.shape[2], cols=True,
    )  # fmt: skip
    problem = decode_layer_operands.mismatch(
        operands, kinds, lambda a, shape, kind: tuple(a.shape) == shape and jnp.dtype(a.dtype) == kind
    )
    if problem is not None:
        raise _refuse(problem)
    problem = decode_layer_operands.structure_problem(w, heads, tuple(k_cache.shape), cos.shape[-1])
    if problem is not None:
        raise _refuse(problem)


def decode_layer(
    x: jax.Array,
    residual: jax.Array | None,
    weights: LayerWeights,
    cos: jax.Array,
    sin: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    pos: jax.Array | int,
    mask: jax.Array,
    *,
    heads: int,
    eps: float,
    scale: float,
    offset: float = 0.0,
    float32_weight: bool = False,
    softcap: float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One decode step of a pre-norm dense layer with a SwiGLU MLP: x [B, 1, H] (the previous layer's increment, or
    the embedding at layer 0 with residual None) and residual [B, 1, H] -> (this layer's MLP increment, the new
    residual, k_cache, v_cache), the caches with the step's keys and values written at slot `pos` (an int32 scalar,
    traced or not; k_cache [B, n_kv, S, d], v_cache [B, n_kv, d, S], their buffers reused where the caller donated
    them) and attended over slots 0..pos with mask [B, 1, S] bool (the slots past pos are not read). Weights in
    Flax's [in, out] layout; cos and sin [B, 1, r] float32; `eps`, `offset` and `float32_weight` are every norm's,
    `scale` and `softcap` the attention's. A pos at or past S writes slot S - 1, as dynamic_update_slice would
    (jax_impl/kv_cache.py records the request and refuses it on the host). A ValueError names a bad operand."""
    _check(x, residual, weights, cos, sin, k_cache, v_cache, mask, heads)
    if not (jax.default_backend() == "cpu" and available()):
        raise _refuse(
            f"runs on the CPU backend with the kernel built (backend {jax.default_backend()}; "
            f"{build.unavailable('decode_layer_xla') or 'built'})"
        )
    dtype = x.dtype

    def given(array: jax.Array | None, as_dtype=dtype) -> jax.Array:  # an absent operand is an empty array
        return jnp.zeros((0,), as_dtype) if array is None else array.astype(as_dtype)

    named = {
        **{name: given(getattr(weights, name)) for name in ("q_norm", "k_norm")},
        **{name: given(getattr(weights, name), jnp.float32) for name in decode_layer_operands.BIASES},
        **{name: getattr(weights, name) for name in ("input_norm", "post_norm", "wq", "wk", "wv", "wo", "wgu", "wd")},
        "x": x, "residual": given(residual), "cos": cos, "sin": sin, "k_cache": k_cache, "v_cache": v_cache,
        "mask": mask, "pos": jnp.asarray(pos, jnp.int32),
    }  # fmt: skip
    operands = [named[name] for name in _OPERANDS]
    caches = {_OPERANDS.index("k_cache"): 2, _OPERANDS.index("v_cache"): 3}  # written in place: results 2 and 3
    results = (  # out, residual_out [B, 1, H]; the two caches
        jax.ShapeDtypeStruct(x.shape, dtype), jax.ShapeDtypeStruct(x.shape, dtype),
        jax.ShapeDtypeStruct(k_cache.shape, dtype), jax.ShapeDtypeStruct(v_cache.shape, dtype),
    )  # fmt: skip
    call = jax.ffi.ffi_call(_TARGET, results, input_output_aliases=caches)
    out, residual_out, k_cache, v_cache = call(
        *operands, heads=np.int64(heads), eps=np.float32(eps), offset=np.float32(offset), scale=np.float32(scale),
        cap=np.float32(softcap or 0.0), float32_weight=np.int32(float32_weight),
        fetch=np.int32(gemv_fetch.fetch(jnp.dtype(dtype).name, "cols")),
    )  # fmt: skip
    return out, residual_out, k_cache, v_cache
