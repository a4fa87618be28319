"""Training: the next-token loss, every parameter's gradient by checkpoint name, and an AdamW step.

Mirrors jax_impl/training.py (same names, same arithmetic; spec/training.py fixes the conventions). The
loss is computed in float32 from the logits whatever the model dtype, without a second float32 [B, T, V]
copy: `ChunkedCrossEntropy` reads the logits a block of rows at a time in its forward (keeping only the
row's log-sum-exp) and writes d_logits the same way in its backward. Labels are shifted by moving them, not
the logits, so the [B, T, V] logits are never sliced into a copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist

from spec import InputError
from spec.training import IGNORE_INDEX, AdamW, check_batch, checkpoint_grads, gather_checkpoint_grads
from torch_impl.model import CausalLM
from torch_impl.optimizer import clip_grad_norm, make_optimizer, runtime_names, sum_replicated_blocks
from torch_impl.vocab_parallel import VocabParallelCrossEntropy

_ROWS = 1024  # rows of logits per block: a [1024, V] float32 temporary, whatever B * T is


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits [N, V] (any float dtype) against targets [N] (-100: not counted)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        counted = targets != IGNORE_INDEX  # [N]
        safe = targets.clamp(min=0)[:, None]  # [N, 1]: any row index where not counted
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)  # [N]
        total = torch.zeros((), dtype=torch.float64, device=logits.device)
        for start in range(0, logits.shape[0], _ROWS):
            rows = slice(start, start + _ROWS)
            x = logits[rows].float()  # [n, V]
            lse[rows] = torch.logsumexp(x, dim=-1)
            nll = lse[rows] - x.gather(-1, safe[rows])[:, 0]
            total += nll.masked_fill(~counted[rows], 0).sum(dtype=torch.float64)
        count = counted.sum()
        ctx.save_for_backward(logits, safe, counted, lse, count)
        return (total / count).float()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, safe, counted, lse, count = ctx.saved_tensors
        d_logits = torch.empty_like(logits)
        scale = grad.float() / count.float()
        for start in range(0, logits.shape[0], _ROWS):
            rows = slice(start, start + _ROWS)
            p = torch.exp(logits[rows].float() - lse[rows, None])  # softmax [n, V]
            p.scatter_add_(-1, safe[rows], torch.full_like(p[:, :1], -1.0))  # - one-hot of the target
            d_logits[rows] = (p * (counted[rows, None] * scale)).to(logits.dtype)
        return d_logits, None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, model: CausalLM | None = None) -> torch.Tensor:
    """logits [B, T, V], labels [B, T] (-100: not counted) -> the mean next-token loss (float32 scalar).

    Logits at t predict labels at t + 1: the labels move left by one and the last position counts nothing.
    For a tensor-parallel `model` the logits are this rank's vocabulary shard and the loss never gathers them.
    """
    targets = torch.full_like(labels, IGNORE_INDEX)
    targets[:, :-1] = labels[:, 1:]  # [B, T]
    flat, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    if model is not None and model.layout.tp > 1:
        return VocabParallelCrossEntropy.apply(flat, targets, model.layout.vocab_start, model.group)
    return ChunkedCrossEntropy.apply(flat, targets)


def _trainable(model: CausalLM) -> list[torch.nn.Parameter]:
    if model.experts is not None:  # gather_checkpoint_grads puts together tensor-parallel slices, not expert runs
        raise InputError("training an expert-parallel model is not supported yet: load it without ep_group")
    params = list(model.parameters())
    if any(p.is_inference() for p in params):
        raise InputError(
            "this model's parameters were created under torch.inference_mode and cannot take a gradient: "
            "load it outside inference_mode"
        )
    return params


def loss(
    model: CausalLM,
    input_ids: np.ndarray,
    labels: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
) -> torch.Tensor:
    """The differentiable loss (a float32 scalar tensor) of one batch; see spec/training.py for the labels."""
    batch = check_batch(input_ids, labels, model.spec, attention_mask)
    logits = model(batch.ids, attention_mask=attention_mask)  # [B, T, V] in the model's dtype (tp > 1: V / tp)
    return cross_entropy(logits, torch.as_tensor(batch.labels, device=logits.device), model)


def loss_and_grads(
    model: CausalLM,
    input_ids: np.ndarray,
    labels: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """(loss, gradients keyed by checkpoint tensor name, float32 numpy in the checkpoint's [out, in] layout).

    The model's parameters are made to require gradients for the call and restored afterwards. Stacked experts'
    gradients come back per expert under the checkpoint's names (spec/training.py).
    """
    params = _trainable(model)
    was = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(True)
        with torch.enable_grad():
            value = loss(model, input_ids, labels, attention_mask)
            grads = torch.autograd.grad(value, params)
    finally:
        for p, flag in zip(params, was, strict=True):
            p.requires_grad_(flag)
    keys = runtime_names(model)
    runtime = {
        keys[name]: g.float().cpu().numpy().copy() for (name, _), g in zip(model.named_parameters(), grads, strict=True)
    }
    if model.layout.tp == 1:
        return float(value.detach()), checkpoint_grads(model.spec, runtime)
    per_rank: list = [None] * model.layout.tp  # every rank's slices, put together by the partition table
    dist.all_gather_object(per_rank, runtime, group=model.group)
    return float(value.detach()), gather_checkpoint_grads(model.spec, per_rank)


def train_step(
    model: CausalLM,
    optimizer: torch.optim.AdamW,
    config: AdamW,
    input_ids: np.ndarray,
    labels: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
) -> float:
    """One step: loss, backward, global-norm clipping (torch's clip_grad_norm_), AdamW. Returns the loss."""
    _trainable(model)  # refuses a model that cannot take a gradient, naming why
    model.requires_grad_(True)
    optimizer.zero_grad(set_to_none=True)
    with torch.enable_grad(), _lookup_rows_added_to_head(model, input_ids):
        value = loss(model, input_ids, labels, attention_mask)
        value.backward()
    sum_replicated_blocks(model)
    if config.max_grad_norm is not None:
        clip_grad_norm(model, config.max_grad_norm)
    optimizer.step()
    return float(value.detach())


@contextlib.contextmanager
def _lookup_rows_added_to_head(model: CausalLM, input_ids: np.ndarray) -> Iterator[None]:
    """A tied table's gradient in `train_step`: the head's dense [V, H] gradient, then the looked-up rows' gradients
    added into it in place (index_add over the B * T ids; the padding row skipped, as F.embedding's padding_idx).

    Autograd computes the same sum through two more [V, H] tensors: the lookup's dense gradient (zeros, then the
    rows) and the out-of-place sum of both uses (its input buffer adds a dense pair out of place). At the 0.6B
    shape each is 622 MB of freshly faulted memory per step. The lookup's output is cut from the graph here (a leaf
    that requires grad); backward leaves its gradient there, and the rows go into the table's .grad after it.
    Only for a tied, unsharded table; `loss_and_grads` keeps autograd's own path. jax_impl has no counterpart: XLA
    plans the step's buffers itself, and its step was measured not to be bound by them (docs/benchmarks.md).
    """
    embed = model.model.embed_tokens
    if not model.spec.tie_word_embeddings or model.layout.tp > 1:
        yield
        return
    leaves: list[torch.Tensor] = []

    def cut(_module: torch.nn.Module, _args: tuple, rows: torch.Tensor) -> torch.Tensor:
        leaves.append(rows.detach().requires_grad_(True))
        return leaves[-1]

    handle = embed.register_forward_hook(cut)
    try:
        yield
    finally:
        handle.remove()
    if len(leaves) != 1 or leaves[0].grad is None:
        raise AssertionError(f"the table's lookup ran {len(leaves)} times in one step, or took no gradient")
    ids = torch.as_tensor(np.asarray(input_ids), device=embed.weight.device).reshape(-1)  # [B * T]
    rows = leaves[0].grad.reshape(ids.shape[0], -1)  # [B * T, H]
    if embed.pad_token_id is not None:
        keep = ids != embed.pad_token_id  # in [0, V): spec.ModelSpec turned a negative config id into its row
        ids, rows = ids[keep], rows[keep]
    if embed.weight.grad is None:  # no loss through the head: the rows are the table's whole gradient
        embed.weight.grad = torch.zeros_like(embed.weight)
    embed.weight.grad.index_add_(0, ids, rows.to(embed.weight.grad.dtype))


def parameters(model: CausalLM) -> dict[str, np.ndarray]:
    """Every parameter by checkpoint tensor name, float32 numpy, [out, in] (what training steps compare).

    Tensor-parallel: every rank's slices put together (a collective: call it on every rank); a replicated kv head
    is taken from one holder."""
    keys = runtime_names(model)
    runtime = {keys[name]: p.detach().float().cpu().numpy().copy() for name, p in model.named_parameters()}  # not views
    if model.layout.tp == 1:
        return checkpoint_grads(model.spec, runtime)
    per_rank: list = [None] * model.layout.tp
    dist.all_gather_object(per_rank, runtime, group=model.group)
    return gather_checkpoint_grads(model.spec, per_rank, sum_replicas=False)


__all__ = [
    "ChunkedCrossEntropy",
    "cross_entropy",
    "loss",
    "loss_and_grads",
    "make_optimizer",
    "parameters",
    "train_step",
]
