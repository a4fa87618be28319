"""The optimizer: torch.optim.AdamW(fused=True)'s arithmetic after torch's clip_grad_norm_, as an optax chain.

Mirrors torch_impl/optimizer.py (spec/training.py fixes the settings). Two transforms, each written to torch's
formula rather than taken from optax, because optax computes differently where it shows:

    torch_like_clip   scale by max_norm / (norm + 1e-6) when below 1 (optax's clip_by_global_norm divides by the
                      norm itself); a tensor-parallel model's replicated kv heads counted once (`stored_copies`)
    torch_adamw       each element's step computed in float32 from the stored values, the moments and the
                      parameter rounded once to their dtype as they are stored. optax.adamw computes in the
                      parameter's dtype: in bfloat16 every intermediate rounds, and the parameters drift from
                      torch's by a bf16 ulp in ~5-8% of the elements per step (measured against torch's fused
                      kernel: 0 of 200,000 elements differ with this transform over 3 steps).

Also what a tensor-parallel step does with the gradients before them (`sum_replicated_blocks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from spec.parallel import holders, replicated_block
from spec.params import runtime_groups
from spec.training import AdamW, decays

_FLAX_ROLE = {"kernel": "weight", "bias": "bias", "weight": "weight"}  # Flax attribute -> the table's role


def runtime_key(path: tuple) -> tuple[str, str]:
    """A Param's state path -> (module, role) of the parameter table."""
    return ".".join(str(p) for p in path[:-1]), _FLAX_ROLE[path[-1]]


def torch_like_clip(max_norm: float, copies: Callable | None = None) -> optax.GradientTransformation:
    """Global-norm clipping as torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when < 1.

    `copies(params)`: a tree like the parameters of how many times each element is stored (a tensor-parallel
    model's replicated kv heads, once per holding rank), so each element's square counts once; None: once each.
    """

    def update(updates, state, params=None):
        norm = optax.tree.norm(updates) if copies is None else global_norm(updates, copies(params))
        scale = jnp.minimum(max_norm / (norm + 1e-6), 1.0)
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class TorchAdamWState(NamedTuple):
    count: jax.Array  # steps taken, int32 scalar
    mu: optax.Updates  # first moment, in each parameter's dtype (as torch stores exp_avg)
    nu: optax.Updates  # second moment, likewise (exp_avg_sq)


def torch_adamw(config: AdamW, decay_mask: Callable) -> optax.GradientTransformation:
    """torch.optim.AdamW(fused=True)'s step as an optax transformation: decoupled weight decay where
    `decay_mask(params)` says so, bias correction on both moments, lerp for the first moment. The update comes
    back in float32, so optax.apply_updates rounds the new parameter once (bf16 + f32 computes in float32)."""
    b1, b2, eps, lr, wd = config.beta1, config.beta2, config.eps, config.lr, config.weight_decay

    def init(params) -> TorchAdamWState:
        zeros = lambda: jax.tree.map(jnp.zeros_like, params)  # noqa: E731 - two distinct trees
        return TorchAdamWState(jnp.zeros([], jnp.int32), zeros(), zeros())

    def update(grads, state: TorchAdamWState, params=None):
        count = state.count + 1
        t = count.astype(jnp.float32)
        step_size = lr / _one_minus_power(b1, t)
        correction2_sqrt = jnp.sqrt(_one_minus_power(b2, t))

        def one(g, m, v, p, decay):
            g32, m32, v32, p32 = (x.astype(jnp.float32) for x in (g, m, v, p))
            m32 = m32 + (1 - b1) * (g32 - m32)  # torch's lerp(exp_avg, grad, 1 - beta1)
            v32 = b2 * v32 + (1 - b2) * g32 * g32
            new = p32 * (1 - lr * wd) if decay else p32
            new = new - step_size * m32 / (jnp.sqrt(v32) / correction2_sqrt + eps)
            return new - p32, m32.astype(m.dtype), v32.astype(v.dtype)

        out = jax.tree.map(one, grads, state.mu, state.nu, params, decay_mask(params))
        pick = lambda k: jax.tree.map(lambda _, o: o[k], grads, out)  # noqa: E731 - the k-th of each leaf's triple
        return pick(0), TorchAdamWState(count, pick(1), pick(2))

    return optax.GradientTransformation(init, update)


def _one_minus_power(beta: float, t: jax.Array) -> jax.Array:
    """1 - beta ** t in float32 to its last bit, as torch computes it in float64: written out, 1 - 0.999 ** 1 loses
    four digits to cancellation (1.0000467e-3), which moved float32 updates by 2e-5 of themselves."""
    return -jnp.expm1(t * (math.log(beta) if beta > 0 else -math.inf))


def global_norm(grads, copies) -> jax.Array:
    """The norm of a gradient tree whose elements are stored `copies` times each (a tree of the same structure)."""
    squares = jax.tree.map(lambda g, c: jnp.sum(jnp.square(g.astype(jnp.float32))) / c, grads, copies)
    return jnp.sqrt(sum(jax.tree.leaves(squares)))


def stored_copies(model) -> Callable[[nnx.State], nnx.State]:
    """params -> a tree like them of how many times the global model stores each element: tp / n_kv for a
    replicated kv head (once per holding rank, spec/parallel.py `holders`), 1 for everything else."""
    groups, tp = runtime_groups(model.spec), model.layout.tp

    def copies(params: nnx.State) -> nnx.State:
        entries = [(path, groups[runtime_key(path)][0]) for path, _ in nnx.to_flat_state(params)]
        return nnx.from_flat_state([(path, holders(e, tp) if replicated_block(e, tp) else 1) for path, e in entries])

    return copies


def sum_replicated_blocks(model, grads: nnx.State) -> nnx.State:
    """Replicated kv heads (tp > num_key_value_heads) are stored once per rank side by side; each copy's gradient
    comes from its rank's query heads only. Every copy takes the sum over the copies of its head, so they step
    alike and stay equal (torch_impl/optimizer.py does the same with one all-reduce)."""
    tp = model.layout.tp
    if tp == 1:
        return grads
    groups, flat = runtime_groups(model.spec), []
    for path, g in nnx.to_flat_state(grads):
        entry = groups[runtime_key(path)][0]
        if replicated_block(entry, tp):  # split axis last in Flax layout: [..., n_kv * copies * d]
            value = g[...]
            blocks = value.reshape(*value.shape[:-1], entry.units, holders(entry, tp), -1)  # [..., n_kv, copies, d]
            g = g.replace(jnp.broadcast_to(blocks.sum(axis=-2, keepdims=True), blocks.shape).reshape(value.shape))
        flat.append((path, g))
    return nnx.from_flat_state(flat)


def make_optimizer(model, config: AdamW) -> nnx.Optimizer:
    """torch.optim.AdamW's arithmetic: clipping, then Adam with bias correction on both moments and decoupled
    weight decay on 2-D weights only (norms and biases excluded: spec/training.py)."""
    kinds = {key: entries[0].kind for key, entries in runtime_groups(model.spec).items()}

    def decay_mask(params: nnx.State) -> nnx.State:
        flat = nnx.to_flat_state(params)
        return nnx.from_flat_state([(path, decays(kinds[runtime_key(path)])) for path, _ in flat])

    copies = stored_copies(model) if model.layout.tp > 1 else None
    chain = [] if config.max_grad_norm is None else [torch_like_clip(config.max_grad_norm, copies)]
    chain.append(torch_adamw(config, decay_mask))
    return nnx.Optimizer(model, optax.chain(*chain), wrt=nnx.Param)


__all__ = [
    "TorchAdamWState",
    "global_norm",
    "make_optimizer",
    "runtime_key",
    "stored_copies",
    "sum_replicated_blocks",
    "torch_adamw",
    "torch_like_clip",
]
