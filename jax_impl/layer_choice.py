"""Whether a dense layer's CPU decode step runs in one call (kernels/cpu/jax_decode_layer.py) or as XLA's operators:
`LAYERS`, a spec/path_choice.py `PathChoice` whose answer is a rule here, where torch_impl/layer_choice.py (its
twin) times the two.

The rule: the one call wherever the few-row kernel applies to all six of the layer's products and each of their
weights streams from memory (at least `linear.MIN_CHOICE_BYTES`); XLA's operators otherwise. Why a rule, not a
timing as in torch (docs/benchmarks.md has the figures):

- A sound timing costs more than choosing may. The operators' pass is only what a decode step runs with its
  products in their chosen forms, so those six keys' timing programs compile first, then the operators' own program,
  XLA's fixed cost of a compilation however short the chain; together over a second on the project's two-core
  machines, where torch, which compiles nothing, times its layer in a fraction of that.
- A cheaper stand-in for the operators' pass, their products each timed alone at its fastest form, was tried and
  is not a lower bound: a product streamed alone, pass after pass of one program, read its weights slower per byte
  than the same products in the operators' chain, so a call judged against it was kept for the wrong reason.
- What the timing would decide, the benchmark shows on every processor family the project has run on (AMD EPYC
  with AVX2 only, Intel Xeon with AVX-512 and AMX, AMD EPYC with AVX-512): a decode step with the call ran at least
  as fast as the same model's step on XLA's operators in every run (once only when the two were compared run by
  run, as the benchmark now compares them, not by the ratio of their medians measured minutes apart), and in
  one-process alternations of the two; benchmarks/cpu_decode.py checks it again in each run (its `jax_impl/per-op`
  variant) and says where it did not hold.

The rule is recorded in `LAYERS` like a measured choice at no cost (`settle`), so a report of the paths lists it.
Products pinned by `linear.PATHS.forced(...)` (spec/layer_choice.py): to the kernel, the one call computes exactly
those products and is taken; to another form, the operators run it. A layer whose weights stay in cache (a test
model's) keeps its operators, as its products keep the single dot. `LAYERS.forced(...)` pins either for tests and
side-by-side runs.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl import linear
from spec.layer_choice import pinned_one_call
from spec.path_choice import PathChoice

LAYERS = PathChoice("jax_impl.decoder_layer", ("one_call", "operators"))


def takes_one_call(layer: nnx.Module, hidden: jax.Array) -> bool:
    """Whether `layer` (jax_impl/decoder_layer.py's DecoderLayer) runs this decode step (traced now) in one call: the
    kernel applies to every one of its six products and their weights stream, or the call is forced."""
    products = _products(layer)
    rows, dtype, dims = hidden.shape[0], hidden.dtype, (((1,), (0,)), ((), ()))
    x2 = [jax.ShapeDtypeStruct((rows, p.in_features), dtype) for p in products]
    if not all("gemv" in linear.forms_for(x, p.kernel[...], dims) for x, p in zip(x2, products, strict=True)):
        return False
    pinned = pinned_one_call(linear.PATHS, LAYERS)
    if pinned is not None:
        return pinned
    if min(_nbytes(p) for p in products) < linear.MIN_CHOICE_BYTES:
        return False  # a layer that stays in cache: nothing streamed for the call to save on
    shapes = tuple(p.kernel.shape for p in products)
    key = (rows, jnp.dtype(dtype).name, shapes, layer.self_attn.q_norm is not None, products[0].bias is not None)
    return LAYERS.settle(key, "one_call") == "one_call"


def _products(layer: nnx.Module) -> tuple[nnx.Linear, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _nbytes(p: nnx.Linear) -> int:
    return math.prod(p.kernel.shape) * jnp.dtype(p.kernel.dtype).itemsize
