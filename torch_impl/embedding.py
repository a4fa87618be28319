"""Token embedding as a row gather, and the tied LM head that reuses the same table.

Mirrors jax_impl/embedding.py. The table E is [V, H]; `forward` gathers rows (never a one-hot
matmul); `attend` computes x @ E^T, the logits of a tied head, from the very same tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torch_impl.linear import linear


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))  # [V, H]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)  # [B, T] -> [B, T, H]

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """Tied logits: x @ E^T with E the embedding table itself."""
        return linear(x, self.weight)  # [B, T, H] -> [B, T, V]
