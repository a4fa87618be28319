"""Token embedding as a row gather, and the tied LM head that reuses the same table.

Mirrors jax_impl/embedding.py. The table E is [V, H]; `forward` gathers rows (never a one-hot
matmul); `attend` computes x @ E^T, the logits of a tied head, from the very same tensor. With tp > 1 the
table holds this rank's vocabulary rows from `vocab_start` (vocab_parallel.py).

`pad_token_id` (spec.ModelSpec, a global id) is transformers' padding_idx: the lookup gives that row no gradient,
the forward is unchanged, and a tied head's use of the table still trains it (docs/design.md, "Training").
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from torch_impl.linear import linear
from torch_impl.vocab_parallel import vocab_parallel_embedding


class Embedding(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        *,
        tp: int = 1,
        vocab_start: int = 0,
        group: dist.ProcessGroup | None = None,
        pad_token_id: int | None = None,
    ):
        super().__init__()
        self.tp, self.vocab_start, self.group = tp, vocab_start, group
        self.pad_token_id = pad_token_id  # global id of the row the lookup does not train (None: every row trains)
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))  # [V, H] (tp > 1: this rank's rows)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            return vocab_parallel_embedding(input_ids, self.weight, self.vocab_start, self.group, self.pad_token_id)
        return F.embedding(input_ids, self.weight, padding_idx=self.pad_token_id)  # [B, T] -> [B, T, H]

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """Tied logits: x @ E^T with E the embedding table itself."""
        return linear(x, self.weight)  # [B, T, H] -> [B, T, V]
