"""Whether a dense layer's CPU decode step runs in one call (kernels/cpu/jax_decode_layer.py) or as XLA's operators,
chosen by timing on the machine that runs them: `LAYERS`, a spec/path_choice.py `PathChoice` of its own.

The products' own choices (jax_impl/linear.py) cannot decide it. Timed alone, XLA's split contraction or single dot
and the few-row kernel stream a decode-sized weight within each other's noise on some machines (one process in two
took another form than the kernel for at least one of a 0.6B layer's products, docs/benchmarks.md), while the one call
saves what the layer's operators cost around the products. So where the kernel applies to all six products, the
layer asks `LAYERS` once per shape, timing chains of CHAIN layers over the model's own weights (resident:
`linear.resident_weights`; evicted from the caches before each pass, as a decode step finds them in memory):

1. The call's chain against a lower bound on the operators' (`_floors`): the layer's products, each at the fastest
   rate any of its forms was timed at (`linear.stream_floor`; their timing programs compiled side by side,
   `linear.compiled_together`). The operators run those products and more, so a call that beats the bound is kept
   without compiling the operators' chain, which cost more than all the rest of choosing (docs/benchmarks.md).
2. Otherwise both chains, the operators' with the products in their chosen forms, timed in turn; the call (the
   default) stays unless the operators beat it in every round.

Products pinned by `linear.PATHS.forced(...)` (spec/layer_choice.py): to the kernel, the one call computes exactly
those products and is taken; to another form, the operators run it. Its cost is charged to linear.PATHS, so what
choosing cost is told in one figure. A layer whose weights stay in cache (a test model's) keeps its operators
unmeasured, as its products keep the single dot. `LAYERS.forced(...)` pins either for tests and side-by-side runs.
torch_impl/layer_choice.py is its twin.
"""

from __future__ import annotations

import dataclasses
import math
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl import linear
from jax_impl.product_timing import buffers, filled
from kernels.cpu import jax_decode_ops
from kernels.cpu.evict import evicting
from spec.layer_choice import pinned_one_call
from spec.path_choice import Floors, Pass, PathChoice

if TYPE_CHECKING:
    from jax_impl.kv_cache import KVCache

# A pass of the call's chain costs a small fraction of compiling the operators' chain (docs/benchmarks.md): the call
# gets 5 passes against the bound.
LAYERS = PathChoice("jax_impl.decoder_layer", ("one_call", "operators"), bound_passes=5)
CHAIN = 2  # layers per timed pass: one 0.6B-shaped layer's pass timed the two alike, two told them apart


def takes_one_call(layer: nnx.Module, hidden: jax.Array, cos: jax.Array, cache: KVCache) -> bool:
    """Whether `layer` (jax_impl/decoder_layer.py's DecoderLayer) runs this decode step (traced now) in one call: the
    kernel applies to every one of its six products, its weights do not stay in cache, and the call was measured
    faster or is forced."""
    products = _products(layer)
    rows, dtype, dims = hidden.shape[0], hidden.dtype, (((1,), (0,)), ((), ()))
    x2 = [jax.ShapeDtypeStruct((rows, p.in_features), dtype) for p in products]
    if not all("gemv" in linear.forms_for(x, p.kernel[...], dims) for x, p in zip(x2, products, strict=True)):
        return False
    pinned = pinned_one_call(linear.PATHS, LAYERS)
    if pinned is not None:
        return pinned
    if min(_nbytes(p) for p in products) < linear.MIN_CHOICE_BYTES:
        return False  # a layer that stays in cache: nothing to stream, nothing worth measuring
    shapes = tuple(p.kernel.shape for p in products)
    key = (rows, jnp.dtype(dtype).name, shapes, layer.self_attn.q_norm is not None, products[0].bias is not None)
    built: dict = {}  # the call's chain, where the bound built it: the full measurement reuses it

    def candidates() -> dict:
        return built | _chains(layer, hidden, cos, cache, tuple(p for p in LAYERS.paths if p not in built))

    return LAYERS.choose(key, candidates, lambda: _floors(layer, hidden, cos, cache, built)) == "one_call"


def _products(layer: nnx.Module) -> tuple[nnx.Linear, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _nbytes(p: nnx.Linear) -> int:
    return math.prod(p.kernel.shape) * jnp.dtype(p.kernel.dtype).itemsize


def _floors(layer: nnx.Module, hidden: jax.Array, cos: jax.Array, cache: KVCache, built: dict) -> Floors | None:
    """The call's timed pass, and a lower bound on the operators' one: its CHAIN layers' products, each at the
    fastest rate any of its forms was timed at (`linear.stream_floor`, which chooses their forms now). Where the call
    beats that, the operators, which run those products and more, cannot: the shortcut saves compiling their chain,
    most of what choosing the layer costs. None where a product has no timed form to bound it. The call's pass goes
    into `built` too, for the full measurement where the bound is not beaten."""
    rows, dims, products = hidden.shape[0], (((1,), (0,)), ((), ())), _products(layer)
    operands = [(jax.ShapeDtypeStruct((rows, p.in_features), hidden.dtype), p.kernel[...]) for p in products]
    precision = products[0].precision  # the model's, for every product
    with linear.compiled_together(operands, dims, precision):
        floors = [linear.stream_floor(x, w, dims, precision) for x, w in operands]
    if any(floor is None for floor in floors):
        return None
    built.update(_chains(layer, hidden, cos, cache, ("one_call",)))
    return built["one_call"], {"operators": CHAIN * sum(floors)}


def _chains(layer: nnx.Module, hidden: jax.Array, cos: jax.Array, cache: KVCache, paths: tuple[str, ...]) -> dict:
    """A timed pass per path in `paths` (at least one): CHAIN copies of `layer` (the model's own weights where
    `linear.resident_weights` offers them, else ones), one decode step each over a cache of `cache`'s slots, compiled
    while the caller traces."""
    graphdef, state = nnx.split(layer)
    leaves, treedef = jax.tree.flatten(state)
    b, _, h = hidden.shape
    # Concrete arrays (`filled`): built by jnp, they were most of what the chain cost to build (docs/benchmarks.md).
    chains = [_weights(leaves, copy) for copy in range(CHAIN)]
    i, k, v = layer.layer_idx, cache.k[layer.layer_idx], cache.v[layer.layer_idx]
    filler = filled((1, 1, 1, 1), k.dtype, 0)  # the other layers' buffers: never read
    timed_cache = dataclasses.replace(
        cache, k=(filler,) * i + (filled(k.shape, k.dtype, 0),), v=(filler,) * i + (filled(v.shape, v.dtype, 0),),
        length=filled((), jnp.int32, 1), requested=filled((), jnp.int32, 0), ring=(False,) * (i + 1),
    )  # fmt: skip
    x = filled((b, 1, h), hidden.dtype, 1)
    rope = filled(cos.shape, jnp.float32, 1)  # [B, 1, r]
    mask = filled((b, 1, k.shape[2]), bool, 1)

    def chain_for(path: str):
        def chain(states, x, rope, mask, cache):  # a function per path: JAX caches a trace per function, not per path
            residual = x
            for state in states:
                layer = nnx.merge(graphdef, jax.tree.unflatten(treedef, state))
                x, residual, cache = layer(x, residual, rope, rope, mask, cache)
            return x, residual

        return chain

    lowered = {}
    for path in paths:
        with LAYERS.forced(path), jax_decode_ops.decode_steps():  # the layer takes the path, not this choice again
            lowered[path] = jax.jit(chain_for(path)).lower(chains, x, rope, mask, timed_cache)
    with ThreadPoolExecutor(len(lowered)) as pool:  # XLA compiles both at once
        compiling = {path: pool.submit(program.compile) for path, program in lowered.items()}
        programs = {path: future.result() for path, future in compiling.items()}

    def run(program) -> None:
        jax.block_until_ready(program(chains, x, rope, mask, timed_cache))

    # Each pass reads the chain's weights from memory, as a decode step finds them (spec/path_choice.py's Pass).
    evict = evicting(buffers(leaf for state in chains for leaf in state))
    runs = {path: (lambda program=program: run(program)) for path, program in programs.items()}
    return runs if evict is None else {path: Pass(run, evict) for path, run in runs.items()}


def _weights(leaves: list[jax.Array], copy: int) -> list[jax.Array]:
    """The layer's parameters as concrete arrays of their shapes: copy `copy` of the model's own (a distinct layer's)
    where offered, else ones."""
    out = []
    for leaf in leaves:
        own = linear.PATHS.resident((tuple(leaf.shape), jnp.dtype(leaf.dtype).name))
        out.append(own[copy % len(own)] if own else filled(leaf.shape, leaf.dtype, 1))
    return out


def charged_choice(layer: nnx.Module, hidden: jax.Array, cos: jax.Array, cache: KVCache) -> bool:
    """`takes_one_call`, its measuring time (if any) charged to linear.PATHS, less the products' own choices made
    meanwhile (the operators' program asks them, and they are charged there already)."""
    before, products = LAYERS.cost(), linear.PATHS.cost()
    taken = takes_one_call(layer, hidden, cos, cache)
    linear.PATHS.charge(max(0.0, (LAYERS.cost() - before) - (linear.PATHS.cost() - products)))
    return taken
