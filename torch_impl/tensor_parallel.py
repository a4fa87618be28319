"""Tensor parallelism for the PyTorch decoder on `torch.distributed` (gloo on CPU, nccl on GPU).

Mirrors jax_impl/tensor_parallel.py. Each rank holds an ordinary `CausalLM` built with `tp` and its process
`group`: the modules take their local shapes from `ShardLayout.local_spec` (spec/parallel.py), and the
loader (torch_impl/loader.py, the same one as tp = 1) reads only this rank's slice of every tensor, as the
partition table (spec/params.py) says. What differs from one process is where partial results meet:

    q/k/v, gate_up   column-parallel (`ColumnParallelLinear`): this rank's output rows; the backward sums dL/dx
    o_proj, down     row-parallel (`RowParallelLinear`): this rank's input columns, then all-reduce (sum), then
                     the bias (GPT-NeoX), added once
    embed_tokens     vocabulary-parallel (vocab_parallel.py): out-of-shard ids give zeros, all-reduce
    lm_head          column-parallel over this rank's vocabulary rows; tied: the embedding shard's Parameter

A rank's forward returns its vocabulary shard of the logits, [B, T, padded_vocab / tp]; `generate` reduces
greedy choices across ranks without gathering them, and torch_impl/training.py's loss reduces the vocabulary
the same way. The collectives are autograd-aware (`reduce_from_ranks`, `ColumnParallelLinear`), so gradients
come out right on every rank. Processes come from torchrun (each calls `from_pretrained(path, group=...)`)
or from torch_impl/tp_launch.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from spec import ModelSpec
from spec.parallel import ShardLayout
from torch_impl.linear import Linear, linear


def rank_layout(spec: ModelSpec, tp: int, group: dist.ProcessGroup | None) -> ShardLayout:
    """This process's layout: rank 0 of 1 without tensor parallelism, else its rank in `group`."""
    return ShardLayout(spec, tp, dist.get_rank(group) if tp > 1 else 0)


class _ReduceFromRanks(torch.autograd.Function):
    """Forward: the sum of every rank's partial result (all-reduce, in place). Backward: each partial gets
    the whole gradient, since the sum's derivative with respect to every term is 1."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.mark_dirty(partial)
        dist.all_reduce(partial, group=group)
        return partial

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _CopyToRanks(torch.autograd.Function):
    """Forward: the identity on an input every rank holds whole. Backward: the sum of the ranks' gradients,
    since each rank's column-parallel product contributes only its own columns' share of dL/dx."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        total = grad.clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


def sum_grad_over_ranks(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The identity, whose backward sums the gradient over the ranks: for a tensor every rank holds whole but
    applies to its own shard of the data (the per-head q/k norms' weight), whose gradient each rank has
    only a part of."""
    return _CopyToRanks.apply(x, group)


class _SumOverRanks(torch.autograd.Function):
    """Forward: the sum of every rank's partial value. Backward: the sum of every rank's gradient, since each
    rank's use of the sum covers only its own shard of what follows (OLMo 2's q/k norm statistic)."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        total = partial.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        total = grad.clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


def sum_over_ranks(partial: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum of the ranks' partial values whose use is itself sharded: all-reduced forward and backward (the sum
    of squares of a norm over a projection split across ranks)."""
    return _SumOverRanks.apply(partial, group)


def reduce_from_ranks(partial: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum of the ranks' partial results; autograd-aware (row-parallel outputs, the vocabulary-parallel gather)."""
    return _ReduceFromRanks.apply(partial, group)


class ColumnParallelLinear(Linear):
    """This rank's output rows of a Linear whose input every rank holds whole (q/k/v, gate_up, the head).

    The forward is the plain product; the backward sums dL/dx over the ranks, so what precedes it (a norm,
    the residual stream) gets the whole gradient on every rank.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, group: dist.ProcessGroup | None = None):
        super().__init__(in_features, out_features, bias=bias)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(sum_grad_over_ranks(x, self.group))


def column_linear(in_features: int, out_features: int, bias: bool, tp: int, group: dist.ProcessGroup | None):
    """A Linear whose outputs are split over `tp` ranks (q/k/v, gate_up, the head): plain when tp = 1."""
    if tp == 1:
        return Linear(in_features, out_features, bias=bias)
    return ColumnParallelLinear(in_features, out_features, bias, group)


class RowParallelLinear(nn.Linear):
    """This rank's input columns of a Linear; the partial products are summed across ranks, then the bias (every
    rank holds it whole) is added once.

    Low-precision partials are summed in float32, the bias added in float32, and rounded once, as the unsharded
    matmul accumulates.
    """

    def __init__(self, in_features: int, out_features: int, group: dist.ProcessGroup | None = None, bias: bool = False):
        super().__init__(in_features, out_features, bias=bias)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = linear(x, self.weight)  # [..., out], this rank's share of the sum over inputs
        if partial.dtype in (torch.float16, torch.bfloat16):
            total = reduce_from_ranks(partial.float(), self.group)
            return (total if self.bias is None else total + self.bias.float()).to(partial.dtype)
        total = reduce_from_ranks(partial, self.group)
        return total if self.bias is None else total + self.bias


def row_linear(
    in_features: int, out_features: int, tp: int, group: dist.ProcessGroup | None, bias: bool = False
) -> nn.Linear:
    """A Linear whose inputs are split over `tp` ranks (o_proj, down_proj): plain when tp = 1. A bias (GPT-NeoX)
    is added once, after the sum over ranks."""
    if tp == 1:
        return Linear(in_features, out_features, bias=bias)
    return RowParallelLinear(in_features, out_features, group, bias)
