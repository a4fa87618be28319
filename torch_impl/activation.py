"""SwiGLU's activation: silu(gate) * up on a merged [..., 2I] input, gate first.

Mirrors jax_impl/activation.py. The math lives in kernels/triton/reference.py (fp32, cast once);
`kernels="fused"` runs the Triton kernel with the same contract.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.triton import reference


class SiluAndMul(nn.Module):
    def __init__(self, *, kernels: str = "reference"):
        super().__init__()
        self.kernels = kernels

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.kernels == "fused":
            from kernels.triton import silu_and_mul  # imports triton: only on the fused path

            return silu_and_mul(gate_up)
        return reference.silu_and_mul_reference(gate_up)  # [..., 2I] -> [..., I]
