"""RMSNorm with the fused add+RMSNorm contract: `forward(x, residual=None)`.

Mirrors jax_impl/layernorm.py. RMSNorm(x) = g * x / sqrt(mean(x^2) + eps): no mean subtraction, an fp32
reduction, eps inside the square root. With a residual it returns (normed, new_residual) where
new_residual = x + residual rounded to the activation dtype (docs/design.md, "The dual-variable flow"). The math
lives in kernels/triton/reference.py; `kernels="fused"` runs the Triton kernel with the same contract.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.triton import reference


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, *, kernels: str = "reference"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # [dim]
        self.eps = eps
        self.kernels = kernels

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.kernels == "fused":
            from kernels.triton import add_rms_norm  # imports triton: only on the fused path

            return add_rms_norm(x, residual, self.weight, self.eps)
        return reference.add_rms_norm_reference(x, residual, self.weight, self.eps)
