"""The norms, all with the fused add+norm contract `forward(x, residual=None)`: RMSNorm (Llama/Qwen, Gemma's
(1 + w), OLMo 2's float32 weight multiply) and LayerNorm with a bias (GPT-NeoX); `make_norm` builds the spec's.

Mirrors jax_impl/layernorm.py. RMSNorm(x) = g * x / sqrt(mean(x^2) + eps): no mean subtraction, an fp32
reduction, eps inside the square root. With a residual it returns (normed, new_residual) where
new_residual = x + residual rounded to the activation dtype (docs/design.md, "The dual-variable flow"). The math
lives in kernels/triton/reference.py; `kernels="fused"` runs the Triton kernel with the same contract; CPU
generation's rows run that math in one C call (kernels/cpu/torch_decode_ops.py). LayerNorm has no kernel: both
`kernels` choices run the reference math below.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.distributed as dist
from torch import nn

from kernels.cpu import torch_decode_ops
from kernels.triton import reference
from spec import ModelSpec
from torch_impl.tensor_parallel import sum_grad_over_ranks, sum_over_ranks


@functools.cache
def _fused_add_rms_norm(options: tuple[str, ...]):
    """The Triton add_rms_norm (imports triton: only on the fused path), refusing by name an option it lacks;
    looked up once per set of options, not per call."""
    from kernels.triton import add_rms_norm

    missing = [name for name in options if name not in inspect.signature(add_rms_norm).parameters]
    if missing:
        raise NotImplementedError(
            f"kernels='fused': the Triton add_rms_norm has no {missing} option yet (Gemma's (1 + w) / the float32 "
            "weight multiply of Gemma and OLMo 2); use kernels='reference'"
        )
    return add_rms_norm


class RMSNorm(nn.Module):
    def __init__(
        self, dim: int, eps: float, *, offset: float = 0.0, float32_weight: bool = False, kernels: str = "reference"
    ):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # [dim]
        self.eps = eps
        self.kernels = kernels
        # Only the non-default options are passed on, so Llama/Qwen calls stay the two-argument contract.
        self.options = {
            **({"offset": offset} if offset else {}),
            **({"float32_weight": True} if float32_weight else {}),
        }

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        *,
        group: dist.ProcessGroup | None = None,
        row_group: dist.ProcessGroup | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`group`: x is this rank's shard of tensor-parallel data (q/k heads): the weight's gradient is summed
        over the ranks (torch_impl/tensor_parallel.py). `row_group`: x [..., dim] is this rank's slice of rows
        that span every rank of the group (OLMo 2's q/k norm over a sharded projection): the mean of squares is
        taken over the whole row."""
        weight = self.weight if group is None else sum_grad_over_ranks(self.weight, group)
        if row_group is not None:
            if residual is not None:
                raise AssertionError("a norm over rows sharded across ranks takes no residual")
            return self._sharded_rows(x, weight, row_group)
        if self.kernels == "fused":
            return _fused_add_rms_norm(tuple(self.options))(x, residual, weight, self.eps, **self.options)
        if torch_decode_ops.takes(x, weight, residual):  # generation's rows: the reference's math in one call
            return torch_decode_ops.add_rms_norm(x, residual, weight, self.eps, **self.options)
        return reference.add_rms_norm_reference(x, residual, weight, self.eps, **self.options)

    def _sharded_rows(self, x: torch.Tensor, weight: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        """add_rms_norm_reference's math with the sum of squares all-reduced: every rank holds an equal slice, so
        the row's width is dim * ranks (replicated kv heads count once per rank in both the sum and the width)."""
        xf = x.float()
        squares = sum_over_ranks(xf.pow(2).sum(-1, keepdim=True), group)  # [..., 1], the whole row's
        normed = xf * torch.rsqrt(squares / (x.shape[-1] * dist.get_world_size(group)) + self.eps)
        offset = self.options.get("offset", 0.0)
        if self.options.get("float32_weight"):
            return (normed * (offset + weight.float())).to(x.dtype)
        return (offset + weight if offset else weight) * normed.to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm with a weight and a bias (GPT-NeoX): mean and variance in float32, (x - mean) * rsqrt(var + eps)
    * w + b in float32, one cast, as torch's layer_norm computes a low-precision input."""

    def __init__(self, dim: int, eps: float, *, kernels: str = "reference"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # [dim]
        self.bias = nn.Parameter(torch.zeros(dim))  # [dim]
        self.eps = eps
        self.kernels = kernels  # no LayerNorm kernel: the fused path runs this same math

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, *, group: dist.ProcessGroup | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if group is not None:
            raise AssertionError("LayerNorm is never applied to tensor-parallel shards (no q/k LayerNorm)")
        if residual is not None:  # the new residual, rounded as an unfused model stores it
            x = (x.float() + residual.float()).to(x.dtype)
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)  # [..., 1]
        centred = xf - mean
        variance = centred.pow(2).mean(-1, keepdim=True)  # [..., 1], biased as torch's
        out = (centred * torch.rsqrt(variance + self.eps) * self.weight.float() + self.bias.float()).to(x.dtype)
        return out if residual is None else (out, x)


def make_norm(spec: ModelSpec, dim: int, *, kernels: str = "reference") -> RMSNorm | LayerNorm:
    """The spec's norm over `dim` features: its kind, weight offset and weight precision (q/k norms too)."""
    if spec.norm_type == "layer":
        return LayerNorm(dim, spec.rms_norm_eps, kernels=kernels)
    return RMSNorm(
        dim, spec.rms_norm_eps, offset=spec.norm_offset, float32_weight=spec.norm_weight_float32, kernels=kernels
    )
