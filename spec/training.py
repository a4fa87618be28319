"""Training, framework-neutral: the loss's labels, the optimizer's one set of hyperparameters, and the names
gradients are reported under. Read by torch_impl/training.py and jax_impl/training.py
(docs/design.md, "Training").

- Labels follow transformers' convention: `labels` [B, T] (default: the ids) are shifted inside the loss
  (logits at t predict labels at t + 1); positions labelled -100 are not counted, nor, where an
  attention_mask is given, a padding position (mask 0) or the token a padding position would predict (the
  first real token of a left-padded row: its "prediction" comes from a pad's state); the loss is the mean
  over the counted tokens, in float32.
- AdamW as torch.optim.AdamW computes it (decoupled weight decay, bias correction on both moments) after
  torch's global-norm clipping (`clip_grad_norm_`: scale by max_norm / (norm + 1e-6) when below 1). Weight
  decay applies to 2-D weights only (Linear weights, the embedding), never to norms or biases: the
  parameter table's `kind` says which.
- Gradients are keyed by checkpoint tensor name in the checkpoint's layout ([out, in]); a packed runtime
  parameter (gate_up) is split back into its checkpoint tensors; a tied table has one gradient (the sum of
  its gather and head uses) under `model.embed_tokens.weight`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spec.config import ModelSpec
from spec.errors import InputError
from spec.inputs import as_host_array, check_attention_mask, check_token_ids
from spec.parallel import ShardLayout, gather_shards, shard_of
from spec.params import EMBEDDING, LINEAR, param_table, runtime_groups

IGNORE_INDEX = -100  # transformers' label for "not counted"


@dataclass(frozen=True)
class AdamW:
    """The one hyperparameter set both backends' optimizers are built from."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    max_grad_norm: float | None = 1.0  # global-norm clipping as torch.nn.utils.clip_grad_norm_; None: off

    def __post_init__(self) -> None:
        def real(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InputError(f"AdamW {name} must be a finite number, got {value!r}")
            return float(value)

        if not real("lr") > 0:
            raise InputError(f"AdamW lr must be > 0, got {self.lr!r}")
        for name in ("beta1", "beta2"):
            if not 0 <= real(name) < 1:
                raise InputError(f"AdamW {name} must be in [0, 1), got {getattr(self, name)!r}")
        if not real("eps") > 0:
            raise InputError(f"AdamW eps must be > 0, got {self.eps!r}")
        if not real("weight_decay") >= 0:
            raise InputError(f"AdamW weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.max_grad_norm is not None and not real("max_grad_norm") > 0:
            raise InputError(f"AdamW max_grad_norm must be > 0 or None, got {self.max_grad_norm!r}")


def decays(kind: str) -> bool:
    """Weight decay on 2-D weights (Linear weights, the embedding) only: never norms or biases."""
    return kind in (LINEAR, EMBEDDING)


def shift_invariant_elements(spec: ModelSpec, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Elements of checkpoint tensor `name` whose gradient is zero in exact arithmetic, or None.

    The key bias: it adds q . b_k to every score of a query, the same constant over all the keys the query sees,
    and softmax ignores a constant shift, so dL/db_k = 0 exactly. Computed, it is rounding noise, and Adam
    divides noise by its own RMS: two correct implementations then move those elements by up to lr in either
    direction. A step comparison leaves them out (parity/gradients.py) and says so.
    """
    if not spec.attention_bias:
        return None
    if name.endswith("self_attn.k_proj.bias"):
        return np.ones(shape, bool)
    if spec.fused_qkv and name.endswith("attention.query_key_value.bias"):
        mask = np.zeros((spec.num_attention_heads, 3, spec.head_dim), bool)  # rows laid out [n, 3, d]
        mask[:, 1] = True  # the key part of every head
        return mask.reshape(shape)
    return None


@dataclass(frozen=True)
class Batch:
    """A training batch, checked: ids int64 [B, T], the mask bool [B, T] (all True where none was given) and the
    labels the loss counts (`check_batch`)."""

    ids: np.ndarray
    mask: np.ndarray
    labels: np.ndarray


def check_batch(
    ids: np.ndarray, labels: np.ndarray | None, spec: ModelSpec, attention_mask: np.ndarray | None = None
) -> Batch:
    """Every training entry point's one check of its batch (both backends' and the transformers reference's).

    The ids and the mask first (spec/inputs.py), then refuses rows too short to predict a next token, labels of a
    wrong shape, a label outside [0, V) other than -100, and a batch in which no token is counted (after the shift),
    naming the value. The labels the loss counts are int64 [B, T]: the ids by default, -100 where not counted
    (padding too).
    """
    ids = check_token_ids(ids, spec)
    mask = None if attention_mask is None else check_attention_mask(attention_mask, *ids.shape)
    return Batch(ids, np.ones(ids.shape, bool) if mask is None else mask, _counted(labels, ids, spec, mask))


def check_labels(
    labels: np.ndarray | None, ids: np.ndarray, spec: ModelSpec, attention_mask: np.ndarray | None = None
) -> np.ndarray:
    """`check_batch`'s labels alone."""
    return check_batch(ids, labels, spec, attention_mask).labels


def _counted(labels: np.ndarray | None, ids: np.ndarray, spec: ModelSpec, attention_mask: np.ndarray | None
             ) -> np.ndarray:  # fmt: skip
    if ids.shape[1] < 2:
        raise InputError(f"a next-token loss needs at least 2 tokens per row, got input_ids of shape {list(ids.shape)}")
    if labels is None:
        labels = ids
    labels = as_host_array(labels, "labels")  # ragged rows and torch/JAX arrays too, each refused or read by name
    if labels.dtype.kind not in "iu":
        raise InputError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.shape != ids.shape:
        raise InputError(f"labels have shape {list(labels.shape)}, the ids {list(ids.shape)}")
    labels = labels.astype(np.int64)
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= spec.vocab_size))
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"label {int(labels[row, col])} at [{row}, {col}] is outside the vocabulary [0, {spec.vocab_size}) "
            f"and is not {IGNORE_INDEX}"
        )
    if attention_mask is not None:  # a padded position is neither predicted nor predicts (its state is not a token's)
        real = attention_mask  # checked: bool [B, T]
        labels = np.where(real, labels, IGNORE_INDEX)
        labels[:, 1:] = np.where(real[:, :-1], labels[:, 1:], IGNORE_INDEX)
    if not (labels[:, 1:] != IGNORE_INDEX).any():
        raise InputError("no token is counted by the loss: every shifted label is -100 or padding")
    return labels


def checkpoint_grads(spec: ModelSpec, runtime: dict[tuple[str, str], np.ndarray]) -> dict[str, np.ndarray]:
    """Runtime parameter gradients (module, role) -> (torch layout) -> checkpoint tensor name -> gradient.

    Packed parameters are split back along axis 0 in the table's order (gate first); a tied table's single
    gradient already holds both of its uses.
    """
    return gather_checkpoint_grads(spec, [runtime])


def gather_checkpoint_grads(
    spec: ModelSpec, per_rank: list[dict[tuple[str, str], np.ndarray]], *, sum_replicas: bool = True
) -> dict[str, np.ndarray]:
    """`checkpoint_grads` of a tensor-parallel model: each rank's runtime gradients (its slices, torch layout,
    rank order) -> whole checkpoint tensors (spec/parallel.py's gather_shards: replicated kv heads summed).
    `sum_replicas=False` puts together parameters instead: a replicated kv head is taken from one holder."""
    tp, grads = len(per_rank), {}
    for key, entries in runtime_groups(spec).items():
        pieces: dict[str, list[np.ndarray]] = {e.name: [] for e in entries}
        for rank, runtime in enumerate(per_rank):
            layout, grad, start = ShardLayout(spec, tp, rank), runtime[key], 0
            for entry in entries:  # a packed parameter holds each part's slice in turn: [gate_r; up_r]
                if entry.part == 0:
                    start = 0
                block = grad if entry.expert is None else grad[entry.expert]  # stacked experts: [E, ...]
                rows = shard_of(np.broadcast_to(np.zeros((), grad.dtype), entry.shape), entry, layout).shape[0]
                pieces[entry.name].append(block[start : start + rows])
                start += rows
        for entry in entries:
            grads[entry.name] = gather_shards(pieces[entry.name], entry, sum_replicas=sum_replicas)
    return grads


def backward_order(spec: ModelSpec) -> list[str]:
    """Checkpoint tensor names in the order backpropagation reaches them: head, final norm, last layer ...
    first layer, embedding. The first gradient that diverges in this order is where a bug shows first.

    The reverse of the order the forward uses them in, which is the parameter table's except that the
    table lists a layer's per-head q/k norms after o_proj, while attention applies them before it."""
    forward: list[str] = []
    deferred: list[str] = []  # a layer's o_proj, until its q/k norms are placed
    for entry in param_table(spec):
        if entry.module.endswith("self_attn.o_proj"):
            deferred.append(entry.name)
            continue
        if deferred and not entry.module.endswith(("self_attn.q_norm", "self_attn.k_norm")):
            forward += deferred
            deferred = []
        forward.append(entry.name)
    return list(reversed(forward + deferred))


__all__ = [
    "IGNORE_INDEX",
    "AdamW",
    "Batch",
    "backward_order",
    "check_batch",
    "check_labels",
    "checkpoint_grads",
    "decays",
    "gather_checkpoint_grads",
]
