"""The vocabulary-parallel ends of a tensor-parallel model: embedding gather, padded logits, what reads them.

Mirrors jax_impl/vocab_parallel.py (same function names, same meaning). The vocabulary is padded to a
multiple of the degree and rank r holds rows [r * shard, (r + 1) * shard) of the embedding and the head
(spec/parallel.py, `ShardLayout`).

- `vocab_parallel_embedding` looks up the ids that fall in this rank's rows, zeroes the rest, and
  all-reduces (sum): each id is found on exactly one rank, so the sum is exact in any dtype. The rank that
  holds row `pad_token_id` gives it no gradient from the lookup (transformers' padding_idx).
- `mask_padding` sets the logits of the padding rows to -inf, so no max, argmax or softmax picks them.
- `greedy_token` reduces each shard's (max, argmax) across ranks, two all-reduces of [B] each: the
  full-vocabulary logits are never gathered on the greedy path.
- `gather_logits` is the explicit request for whole logits [..., V] (padding dropped), on every rank.

The embedding's sum across ranks is autograd-aware (each rank's rows get the gradient of their own ids);
the greedy reduction and the gather are inference-only reads of the logits.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from torch_impl.tensor_parallel import reduce_from_ranks


def vocab_parallel_embedding(
    input_ids: torch.Tensor,
    weight: torch.Tensor,
    vocab_start: int,
    group: dist.ProcessGroup | None = None,
    pad_token_id: int | None = None,
) -> torch.Tensor:
    """ids [B, T] (global, already validated) and this rank's rows [shard, H] -> embeddings [B, T, H].

    `pad_token_id` (global) names the row the lookup does not train; only the rank holding it sees it."""
    outside = (input_ids < vocab_start) | (input_ids >= vocab_start + weight.shape[0])  # [B, T]
    local = (input_ids - vocab_start).masked_fill(outside, 0)  # any in-range row; zeroed below
    pad = None if pad_token_id is None else pad_token_id - vocab_start
    pad = pad if pad is not None and 0 <= pad < weight.shape[0] else None  # this rank's row, or none here
    hidden = F.embedding(local, weight, padding_idx=pad).masked_fill(outside[..., None], 0)  # [B, T, H]
    return reduce_from_ranks(hidden, group)  # one rank holds each id's row, the others add zeros


def mask_padding(logits: torch.Tensor, vocab_start: int, vocab_size: int) -> torch.Tensor:
    """logits [..., shard] of rows [vocab_start, vocab_start + shard): those at or past `vocab_size` -> -inf."""
    real = min(max(vocab_size - vocab_start, 0), logits.shape[-1])  # 0 on a shard that is all padding
    if real < logits.shape[-1]:
        logits[..., real:] = float("-inf")
    return logits


def gather_logits(local_logits: torch.Tensor, vocab_size: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The explicit full gather: local [..., shard] on every rank -> [..., vocab_size] on every rank.

    Shards are concatenated in rank order and the padding columns past `vocab_size` are dropped. The
    greedy path never calls this.
    """
    local = local_logits.contiguous()
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local, group=group)
    return torch.cat(parts, dim=-1)[..., :vocab_size]  # [..., padded] -> [..., V]


def greedy_token(local_logits: torch.Tensor, vocab_start: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """local logits [..., shard] -> the global argmax id [...] (int64), identical on every rank.

    Each rank takes its local max and argmax (argmax returns the first, i.e. lowest, local id among ties);
    an all-reduce MAX gives the global best value, and an all-reduce MIN over the ids of the ranks that
    reach it breaks ties by the lowest global id, as `argmax` over the full row would.
    """
    values, local_ids = local_logits.float().max(dim=-1)  # [...]
    best = values.clone()
    dist.all_reduce(best, op=dist.ReduceOp.MAX, group=group)
    no_candidate = torch.iinfo(torch.int64).max
    ids = torch.where(values == best, local_ids + vocab_start, no_candidate)  # [...]
    dist.all_reduce(ids, op=dist.ReduceOp.MIN, group=group)
    return ids


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of this rank's logits [N, V/tp] against global targets [N] (-100: not counted),
    without gathering the vocabulary: the local max then a MAX across ranks, the local sum of exponentials
    then a SUM, the target's logit from the rank that owns it then a SUM. Only [N] vectors cross ranks.
    The backward is local: this rank's softmax minus the one-hot of its own ids. Twin of
    jax_impl/vocab_parallel.py's vocab_parallel_cross_entropy."""

    @staticmethod
    def forward(ctx, logits, targets, vocab_start: int, group: dist.ProcessGroup | None) -> torch.Tensor:
        x = logits.float()  # [N, V/tp]
        top = x.max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        total = torch.exp(x - top[:, None]).sum(-1)
        dist.all_reduce(total, group=group)
        lse = top + torch.log(total)  # [N]
        local = targets - vocab_start
        owned = (local >= 0) & (local < x.shape[-1])
        target = x.gather(-1, local.clamp(0, x.shape[-1] - 1)[:, None])[:, 0].masked_fill(~owned, 0)
        dist.all_reduce(target, group=group)
        counted = targets != -100
        count = counted.sum()
        ctx.save_for_backward(logits, local, owned, counted, lse, count)
        return ((lse - target).masked_fill(~counted, 0).sum(dtype=torch.float64) / count).float()

    @staticmethod
    def backward(ctx, grad):
        logits, local, owned, counted, lse, count = ctx.saved_tensors
        p = torch.exp(logits.float() - lse[:, None])  # [N, V/tp]
        p.scatter_add_(-1, local.clamp(0, p.shape[-1] - 1)[:, None], -owned.float()[:, None])
        return (p * (counted[:, None] * (grad.float() / count.float()))).to(logits.dtype), None, None, None
