"""The vocabulary-parallel ends of a tensor-parallel model: embedding, tied head, and what reads the logits.

Part of torch_impl/tensor_parallel.py (which builds the model and launches the processes); the JAX twin is
jax_impl/sharding.py. The vocabulary is padded to `padded_vocab` (a multiple of the tensor-parallel
degree) and rank r holds rows [r * shard, (r + 1) * shard) of the embedding / head, shard = padded / tp.

- `VocabParallelEmbedding` looks up the ids that fall in its shard, zeroes the rest, and all-reduces
  (sum): each id is found on exactly one rank, so the sum is exact in any dtype.
- `VocabParallelLMHead` computes this shard's logits [..., shard] (tied: from the embedding shard
  itself) and masks the padding rows to -inf, so that no max, argmax or softmax can pick them.
- `greedy_token` reduces each shard's (max, argmax) across ranks, two all-reduces of [B] each, so the
  full-vocabulary logits are never gathered on the greedy path; `gather_logits` is the explicit
  request that does gather them (and drops the padding).

Collectives mutate their input in place and are not recorded by autograd: this is an inference path.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from torch_impl.embedding import Embedding
from torch_impl.linear import linear


class VocabParallelEmbedding(Embedding):
    """Rows [vocab_start, vocab_start + shard) of the padded table; takes and validates nothing but global ids."""

    def __init__(self, shard: int, hidden_size: int, vocab_start: int, group: dist.ProcessGroup | None = None):
        super().__init__(shard, hidden_size)  # weight [shard, H]
        self.vocab_start, self.vocab_end = vocab_start, vocab_start + shard
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Ids were checked against the full vocabulary at the model boundary (CausalLM.forward).
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)  # [B, T]
        local = (input_ids - self.vocab_start).masked_fill(outside, 0)  # any in-range row; zeroed below
        hidden = F.embedding(local, self.weight).masked_fill(outside[..., None], 0)  # [B, T, H]
        dist.all_reduce(hidden, group=self.group)  # one rank holds each id's row, the others add zeros
        return hidden

    def extra_repr(self) -> str:
        return f"rows [{self.vocab_start}, {self.vocab_end}) of the padded vocabulary"


class VocabParallelLMHead(nn.Linear):
    """x [..., H] -> this shard's logits [..., shard], padding rows at -inf. Tied: weight is the embedding's."""

    def __init__(self, hidden_size: int, shard: int, vocab_start: int, vocab_size: int):
        super().__init__(hidden_size, shard, bias=False)
        self.vocab_start = vocab_start
        # Local rows at or past `real` are padding (ids >= vocab_size); 0 on a shard that is all padding.
        self.real = min(max(vocab_size - vocab_start, 0), shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = linear(x, self.weight)  # [..., shard]
        if self.real < self.out_features:
            logits[..., self.real :] = float("-inf")  # padding can never be the max nor get probability
        return logits

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, vocab_start={self.vocab_start}, real_rows={self.real}"


def gather_logits(local_logits: torch.Tensor, vocab_size: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The explicit full gather: local [..., shard] on every rank -> [..., vocab_size] on every rank.

    Shards are concatenated in rank order (rank r holds ids [r * shard, (r + 1) * shard)) and the padding
    columns past `vocab_size` are dropped. The greedy path never calls this.
    """
    local = local_logits.contiguous()
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local, group=group)
    return torch.cat(parts, dim=-1)[..., :vocab_size]  # [..., padded] -> [..., V]


def greedy_token(local_logits: torch.Tensor, vocab_start: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """local logits [..., shard] -> the global argmax id [...] (int64), identical on every rank.

    Each rank takes its local max and argmax (argmax returns the first, i.e. lowest, local id among ties);
    an all-reduce MAX gives the global best value, and an all-reduce MIN over the ids of the ranks that
    reach it breaks ties by the lowest global id, as `argmax` over the full row would. Only [...]-shaped
    tensors cross ranks.
    """
    values, local_ids = local_logits.float().max(dim=-1)  # [...]
    best = values.clone()
    dist.all_reduce(best, op=dist.ReduceOp.MAX, group=group)
    no_candidate = torch.iinfo(torch.int64).max
    ids = torch.where(values == best, local_ids + vocab_start, no_candidate)  # [...]
    dist.all_reduce(ids, op=dist.ReduceOp.MIN, group=group)
    return ids
