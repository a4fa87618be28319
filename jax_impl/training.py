"""Training: the next-token loss, every parameter's gradient by checkpoint name, and an AdamW step.

Mirrors torch_impl/training.py (same names, same arithmetic; spec/training.py fixes the conventions). The
loss is computed in float32 from the logits whatever the model dtype; `cross_entropy`'s custom VJP keeps
only the logits and each row's log-sum-exp for the backward (XLA fuses the float32 upcast into the
reductions and into d_logits), so no second float32 [B, T, V] array is kept. Labels are shifted by moving
them, not the logits. The optimizer (an optax chain doing torch's clipping and fused AdamW arithmetic) is
jax_impl/optimizer.py's; `train_step` runs loss, gradients and update in one compiled program.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_impl.model import CausalLM, attention_masks, default_positions
from jax_impl.optimizer import make_optimizer, runtime_key, sum_replicated_blocks, torch_like_clip
from jax_impl.tensor_parallel import on_mesh
from jax_impl.vocab_parallel import vocab_parallel_cross_entropy
from spec import InputError
from spec.parallel import split_axis
from spec.params import LINEAR, runtime_groups
from spec.training import IGNORE_INDEX, AdamW, check_batch, gather_checkpoint_grads


@jax.custom_vjp
def _mean_nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean cross-entropy of logits [N, V] (any float dtype) against targets [N] (-100: not counted)."""
    return _nll_fwd(logits, targets)[0]


def _nll_fwd(logits, targets):
    counted = targets != IGNORE_INDEX  # [N]
    x = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(x, axis=-1)  # [N]
    target = jnp.take_along_axis(x, jnp.maximum(targets, 0)[:, None], axis=-1)[:, 0]
    count = counted.sum()
    value = jnp.where(counted, lse - target, 0.0).sum() / count
    return value, (logits, targets, lse, count)


def _nll_bwd(residuals, grad):
    logits, targets, lse, count = residuals
    counted = targets != IGNORE_INDEX
    p = jnp.exp(logits.astype(jnp.float32) - lse[:, None])  # softmax [N, V]
    onehot = jnp.arange(logits.shape[-1])[None, :] == targets[:, None]  # never true where targets = -100
    scale = jnp.where(counted, grad / count, 0.0)[:, None]
    return ((p - onehot) * scale).astype(logits.dtype), None


_mean_nll.defvjp(_nll_fwd, _nll_bwd)


def cross_entropy(logits: jax.Array, labels: jax.Array, tp: int = 1) -> jax.Array:
    """logits [B, T, V], labels [B, T] (-100: not counted) -> the mean next-token loss (float32 scalar).

    Logits at t predict labels at t + 1: the labels move left by one and the last position counts nothing.
    With tp > 1 the logits are vocabulary-sharded on a mesh and the loss never gathers them
    (vocab_parallel.py).
    """
    targets = jnp.concatenate([labels[:, 1:], jnp.full_like(labels[:, :1], IGNORE_INDEX)], axis=1)  # [B, T]
    if tp > 1:
        return vocab_parallel_cross_entropy(logits, targets)
    return _mean_nll(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _loss_of(graphdef, params, rest, ids, key_valid, labels):
    model = nnx.merge(graphdef, params, rest)
    t = ids.shape[1]
    logits, _ = model.logits(ids, default_positions(key_valid, 0, t), attention_masks(model.spec, key_valid, 0, t))
    return cross_entropy(logits, labels, model.layout.tp)


@partial(jax.jit, static_argnames=("graphdef",))
def _value_and_grad(graphdef, params, rest, ids, key_valid, labels):
    """The one jit-compiled entry point of the loss and its gradients."""
    return jax.value_and_grad(_loss_of, argnums=1)(graphdef, params, rest, ids, key_valid, labels)


def _batch(model: CausalLM, input_ids, labels, attention_mask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batch = check_batch(input_ids, labels, model.spec, attention_mask)
    return batch.ids.astype(np.int32), batch.mask, batch.labels.astype(np.int32)


def _checkpoint_layout(model: CausalLM, state: nnx.State, *, sum_replicas: bool = True) -> dict[str, np.ndarray]:
    """Param-shaped values (gradients or parameters) -> checkpoint names, float32 numpy, torch layout.

    A tensor-parallel model's arrays hold every rank's slice side by side along the split axis: cut into the
    ranks' slices, they are put back together as spec.training.gather_checkpoint_grads does for torch ranks
    (`sum_replicas`: replicated kv heads' gradients summed; False for parameters: one copy taken).
    """
    groups, tp = runtime_groups(model.spec), model.layout.tp
    per_rank: list[dict] = [{} for _ in range(tp)]
    for path, value in nnx.to_flat_state(state):
        key = runtime_key(path)
        entry = groups[key][0]
        array = np.asarray(value[...] if hasattr(value, "get_value") else value, dtype=np.float32)
        array = np.swapaxes(array, -1, -2) if entry.kind == LINEAR else array  # Flax [in, out] -> [out, in]
        axis = split_axis(entry)
        if axis is not None and entry.expert is not None:  # stacked experts [E, ...]: one expert's axis, moved up
            axis += 1
        slices = [array] * tp if axis is None else np.split(array, tp, axis=axis)
        for rank in range(tp):
            per_rank[rank][key] = slices[rank]
    return gather_checkpoint_grads(model.spec, per_rank, sum_replicas=sum_replicas)


def _on_mesh(model: CausalLM, fn, *batch: np.ndarray):
    """fn(*batch): plainly on one device, or under the mesh the parameters live on (tensor_parallel.on_mesh)."""
    if model.layout.tp == 1 and model.ep == 1:
        return fn(*batch)
    return on_mesh(model.model.embed_tokens.weight[...].sharding.mesh, fn, *batch)


def loss_and_grads(
    model: CausalLM,
    input_ids: np.ndarray,
    labels: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """(loss, gradients keyed by checkpoint tensor name, float32 numpy in the checkpoint's [out, in] layout)."""
    ids, key_valid, counted = _batch(model, input_ids, labels, attention_mask)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    value, grads = _on_mesh(model, partial(_value_and_grad, graphdef, params, rest), ids, key_valid, counted)
    return float(value), _checkpoint_layout(model, grads)


@partial(nnx.jit, donate_argnames=("model", "optimizer"))  # updated in place: no second copy of weights and moments
def _step(model: CausalLM, optimizer: nnx.Optimizer, ids, key_valid, labels):
    def loss_fn(model: CausalLM) -> jax.Array:
        t = ids.shape[1]
        logits, _ = model.logits(ids, default_positions(key_valid, 0, t), attention_masks(model.spec, key_valid, 0, t))
        return cross_entropy(logits, labels, model.layout.tp)

    value, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, sum_replicated_blocks(model, grads))
    return value


def train_step(
    model: CausalLM,
    optimizer: nnx.Optimizer,
    config: AdamW,
    input_ids: np.ndarray,
    labels: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
) -> float:
    """One step: loss, gradients, clipping, AdamW (all in one compiled program). Returns the loss.

    `config` is the one the optimizer was made from (the same signature as torch_impl.train_step).
    """
    if model.ep > 1:
        raise InputError("train_step on an expert-parallel model is not supported yet (loss_and_grads is)")
    ids, key_valid, counted = _batch(model, input_ids, labels, attention_mask)
    return float(_on_mesh(model, partial(_step, model, optimizer), ids, key_valid, counted))


def parameters(model: CausalLM) -> dict[str, np.ndarray]:
    """Every parameter by checkpoint tensor name, float32 numpy, [out, in] (what training steps compare)."""
    return _checkpoint_layout(model, nnx.state(model, nnx.Param), sum_replicas=False)


__all__ = ["cross_entropy", "loss_and_grads", "make_optimizer", "parameters", "torch_like_clip", "train_step"]
