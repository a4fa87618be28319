"""Tensor parallelism for the PyTorch decoder on `torch.distributed` (gloo on CPU, nccl on GPU).

Mirrors jax_impl/tensor_parallel.py. Each rank holds an ordinary `CausalLM` built with `tp` and its process
`group`: the modules take their local shapes from `ShardLayout.local_spec` (spec/parallel.py), and the
loader (torch_impl/loader.py, the same one as tp = 1) reads only this rank's slice of every tensor, as the
partition table (spec/params.py) says. What differs from one process is where partial results meet:

    q/k/v, gate_up   column-parallel: this rank's output rows (no communication)
    o_proj, down     row-parallel (`RowParallelLinear`): this rank's input columns, then all-reduce (sum)
    embed_tokens     vocabulary-parallel (vocab_parallel.py): out-of-shard ids give zeros, all-reduce
    lm_head          this rank's vocabulary rows; tied: the embedding shard's own Parameter

A rank's forward returns its vocabulary shard of the logits, [B, T, padded_vocab / tp]; `generate` reduces
greedy choices across ranks without gathering them. Processes come from torchrun (each calls
`from_pretrained(path, group=...)`) or from torch_impl/tp_launch.py. Inference only.
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


class RowParallelLinear(nn.Linear):
    """This rank's input columns of a bias-free Linear; the partial products are summed across ranks.

    Low-precision partials are summed in float32 and rounded once, as the unsharded matmul accumulates.
    """

    def __init__(self, in_features: int, out_features: int, group: dist.ProcessGroup | None = None):
        super().__init__(in_features, out_features, bias=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = linear(x, self.weight)  # [..., out], this rank's share of the sum over inputs
        if partial.dtype in (torch.float16, torch.bfloat16):
            total = partial.float()
            dist.all_reduce(total, group=self.group)
            return total.to(partial.dtype)
        dist.all_reduce(partial, group=self.group)
        return partial


def row_linear(in_features: int, out_features: int, tp: int, group: dist.ProcessGroup | None) -> nn.Linear:
    """A bias-free Linear whose inputs are split over `tp` ranks (o_proj, down_proj): plain when tp = 1."""
    if tp == 1:
        return Linear(in_features, out_features, bias=False)
    return RowParallelLinear(in_features, out_features, group)
