"""Whether a dense layer's CPU decode step runs in one call (kernels/cpu/torch_decode_layer.py) or as torch's
operators, chosen by timing on the machine that runs it: `LAYERS`, a spec/path_choice.py `PathChoice` of its own.
Mirrors jax_impl/layer_choice.py, which decides by a rule instead: there a sound timing costs compilations, here
nothing compiles.

The products' own choices (torch_impl/linear.py) cannot decide it. Timed alone, F.linear and the few-row kernel can
stream a decode-sized weight within a few percent of each other, and one product's near-tie taken the other way would
keep the whole layer on its operators (its ~30 calls from Python a step), though the one call runs the same kernel
products and saves what those calls cost around them (docs/benchmarks.md). So where the kernel applies to all six
products, the layer asks `LAYERS` once per shape, timing one decode step of the layer itself each way over a scratch
cache of as many filled slots as its own, its weights evicted from the caches before each pass
(kernels/cpu/evict.py), as a decode step finds them in memory. Both passes are cheap to build in torch (nothing
compiles), so both are timed; the call (the default) stays unless the operators beat it in every round.

Products pinned by `linear.PATHS.forced(...)` (spec/layer_choice.py): to the kernel, the one call computes exactly
those products (bit for bit: tests/kernels/test_cpu_decode_layer.py) and is taken; to another path, the operators
run it. A layer whose weights stay in cache (a test model's) keeps its operators unmeasured. `LAYERS.forced(...)`
pins either. Its cost is charged to linear.PATHS, so what choosing cost is told in one figure.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from kernels.cpu.evict import evicting
from spec.layer_choice import pinned_one_call
from spec.path_choice import Pass, PathChoice, Timed
from torch_impl import linear
from torch_impl.kv_cache import KVCache

# Three rounds, as the products' choice: a one-layer pass is a few ms, and a near-tie must not move the layer on noise.
LAYERS = PathChoice("torch_impl.decoder_layer", ("one_call", "operators"), repeats=3)


def takes_one_call(
    layer: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None, cos, sin, mask, cache: KVCache
) -> bool:
    """Whether `layer` (torch_impl/decoder_layer.py's DecoderLayer) runs this decode step in one call: the kernel
    applies to every one of its six products, their path is not pinned to another one, and the call was measured
    faster (or is forced; see the docstring)."""
    products, rows = _products(layer), hidden.shape[0] * hidden.shape[1]
    x2 = [hidden.new_empty((rows, p.weight.shape[1])) for p in products]  # [tokens, in] as each product takes it
    if not all("gemv" in linear.forms_for(x, p.weight, p.bias) for x, p in zip(x2, products, strict=True)):
        return False
    pinned = pinned_one_call(linear.PATHS, LAYERS)
    if pinned is not None:
        return pinned
    if min(p.weight.numel() * p.weight.element_size() for p in products) < linear.MIN_CHOICE_BYTES:
        return False  # a layer that stays in cache: nothing to stream, nothing worth measuring
    shapes = tuple(tuple(p.weight.shape) for p in products)
    key = (rows, str(hidden.dtype).removeprefix("torch."), shapes, layer.self_attn.q_norm is not None)
    key += (products[0].bias is not None,)
    return LAYERS.choose(key, lambda: _passes(layer, hidden, residual, cos, sin, mask, cache)) == "one_call"


def charged_choice(
    layer: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None, cos, sin, mask, cache: KVCache
) -> bool:
    """`takes_one_call`, its measuring time (if any) charged to linear.PATHS, less the products' own choices made
    meanwhile (the operators' pass asks them, and they are charged there already)."""
    before, products = LAYERS.cost(), linear.PATHS.cost()
    taken = takes_one_call(layer, hidden, residual, cos, sin, mask, cache)
    linear.PATHS.charge(max(0.0, (LAYERS.cost() - before) - (linear.PATHS.cost() - products)))
    return taken


def _products(layer: nn.Module) -> tuple[nn.Linear, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _passes(
    layer: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None, cos, sin, mask, cache: KVCache
) -> dict[str, Timed]:
    """A timed pass per path: this decode step of `layer` (its forward, not its module call, whose hooks must not see
    a timing pass) over a scratch cache of the filled slots and this step's one, so the pass attends to as many keys
    as the step; its writes land in the scratch, never in `cache`, and it costs no more memory than they hold."""
    i, slots = layer.layer_idx, cache.length + 1
    (b, n_kv, _, d), dtype = cache.k[i].shape, cache.k[i].dtype
    filler = torch.zeros((), dtype=dtype)  # the other layers' entries: never read
    k, v = torch.zeros(b, n_kv, slots, d, dtype=dtype), torch.zeros(b, n_kv, d, slots, dtype=dtype)  # as KVCache's
    scratch = KVCache((filler,) * i + (k,), (filler,) * i + (v,), slots, (False,) * (i + 1))
    scratch.length = cache.length
    weights = [t for t in layer._walk()[1] if t is not None]
    evict = evicting((t.data_ptr(), t.numel() * t.element_size()) for t in (*weights, scratch.k[i], scratch.v[i]))

    def step(path: str) -> Callable[[], object]:
        def run() -> None:
            with LAYERS.forced(path), torch.inference_mode():
                layer.forward(hidden, residual, cos, sin, mask, scratch)

        return run

    runs = {path: step(path) for path in LAYERS.paths}
    return runs if evict is None else {path: Pass(run, evict) for path, run in runs.items()}
