"""Rotary position embedding, rotate-half convention (the Hugging Face / Qwen / Llama layout), full or partial.

Mirrors jax_impl/rotary_embedding.py. Frequencies (theta and any linear / llama3 scaling) come from
the spec as float32, identical bits in both backends; a layer kind with its own RoPE (Gemma 3's sliding
layers) has its own table. Angles, cos, sin and the rotation are computed in float32 and cast once to the
activation dtype. Partial rotary (GPT-NeoX) rotates the first rotary_dim dims of each head and passes the
rest through unchanged. CPU generation's rows (its prompt's and decode steps') are rotated in one C call with
this math (kernels/cpu/torch_decode_ops.py).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.cpu import torch_decode_ops
from spec import ModelSpec
from spec.families import FULL


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dim: pairs are (i, i + d/2), not (2i, 2i + 1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, n, d]; cos, sin [B, T, r] float32 with r <= d: the first r dims of each head are rotated."""
    if torch_decode_ops.takes(x, cos, sin):  # generation's rows: this function's math in one C call
        return torch_decode_ops.rotary(x, cos, sin)
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:  # partial rotary: rotate x[..., :r], keep x[..., r:]
        return torch.cat((apply_rotary(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    xf = x.float()
    out = xf * cos[:, :, None, :] + rotate_half(xf) * sin[:, :, None, :]
    return out.to(x.dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, spec: ModelSpec, layer_type: str = FULL):
        super().__init__()
        self.spec, self.layer_type = spec, layer_type
        self.register_buffer("inv_freq", self.frequencies(), persistent=False)  # [r/2] fp32

    def frequencies(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """This kind's inverse frequencies [rotary_dim / 2] from the spec (the loader resets the buffer with it)."""
        return torch.from_numpy(self.spec.inv_freq(self.layer_type)).to(device)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] int -> (cos, sin), each [B, T, rotary_dim] float32."""
        freqs = positions.float()[..., None] * self.inv_freq  # [B, T, r/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [B, T, r]
        return angles.cos(), angles.sin()
