"""Rotary position embedding, rotate-half convention (the Hugging Face / Qwen / Llama layout).

Mirrors jax_impl/rotary_embedding.py. Frequencies (theta and any linear / llama3 scaling) come from
the spec as float32, identical bits in both backends. Angles, cos, sin and the rotation are computed in
float32 and cast once to the activation dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from spec import ModelSpec


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dim: pairs are (i, i + d/2), not (2i, 2i + 1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, n, d]; cos, sin [B, T, d] float32."""
    xf = x.float()
    out = xf * cos[:, :, None, :] + rotate_half(xf) * sin[:, :, None, :]
    return out.to(x.dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.register_buffer("inv_freq", torch.from_numpy(spec.inv_freq()), persistent=False)  # [d/2] fp32

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] int -> (cos, sin), each [B, T, d] float32."""
        freqs = positions.float()[..., None] * self.inv_freq  # [B, T, d/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [B, T, d]
        return angles.cos(), angles.sin()
