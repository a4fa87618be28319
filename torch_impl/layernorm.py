"""RMSNorm with the fused add+RMSNorm contract: `forward(x, residual=None)`.

Mirrors jax_impl/layernorm.py. RMSNorm(x) = g * x / sqrt(mean(x^2) + eps): no mean subtraction, an fp32
reduction, eps inside the square root. With a residual it returns (normed, new_residual) where
new_residual = x + residual rounded to the activation dtype (docs/design.md, "The dual-variable flow"). The math
lives in kernels/triton/reference.py; `kernels="fused"` runs the Triton kernel with the same contract.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from kernels.triton import reference
from torch_impl.tensor_parallel import sum_grad_over_ranks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, *, kernels: str = "reference"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # [dim]
        self.eps = eps
        self.kernels = kernels

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, *, group: dist.ProcessGroup | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`group`: x is this rank's shard of tensor-parallel data (q/k heads): the weight's gradient is summed
        over the ranks (torch_impl/tensor_parallel.py)."""
        weight = self.weight if group is None else sum_grad_over_ranks(self.weight, group)
        if self.kernels == "fused":
            from kernels.triton import add_rms_norm  # imports triton: only on the fused path

            return add_rms_norm(x, residual, weight, self.eps)
        return reference.add_rms_norm_reference(x, residual, weight, self.eps)
