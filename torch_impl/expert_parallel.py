"""Expert parallelism for the PyTorch decoder on `torch.distributed`: each rank of an expert-parallel group holds a
contiguous run of every sparse layer's experts (spec/parallel.py's `expert_range`).

Mirrors the "expert" mesh axis of jax_impl. Ranks are laid out rank = ep_rank * tp + tp_rank: a tensor-parallel
group is the tp ranks of one ep_rank (they split every tensor as without experts), an expert-parallel group the
ep ranks of one tp_rank (they hold the same slices of different experts). Everything but the experts is the
same on every rank of an expert-parallel group.

How tokens reach their experts: every rank of the group already holds every token (there is no data
parallelism here: the batch is replicated, as under tensor parallelism), so no token has to travel. Each
rank runs the router on all tokens (it is replicated), computes its own experts' contributions for the
(token, slot) pairs routed to them, and the partial outputs are summed over the group with one all-reduce
per sparse layer (torch_impl/moe.py, `reduce_groups`). That is the all-to-all dispatch + combine in the
replicated-batch case: an all-to-all would send each rank's tokens to the expert holders and the results back,
which only pays when ranks hold different tokens. The all-reduce is autograd-aware, and the inputs and the
routing weights pass `sum_grad_over_ranks`, so gradients are whole on every rank.
"""

from __future__ import annotations

import torch.distributed as dist

from spec import ModelSpec
from spec.parallel import check_ep_degree, expert_range


def rank_experts(spec: ModelSpec, ep_group: dist.ProcessGroup | None) -> range | None:
    """The global expert indices this process holds in `ep_group`; None: all of them (no expert parallelism)."""
    if ep_group is None or not spec.num_experts:
        return None
    ep = dist.get_world_size(ep_group)
    check_ep_degree(spec, ep)
    return None if ep == 1 else expert_range(spec, ep, dist.get_rank(ep_group))


def parallel_groups(tp: int, ep: int) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """(tensor-parallel group, expert-parallel group) of this process in a world of tp * ep ranks laid out
    rank = ep_rank * tp + tp_rank. Every process must call it (new_group is collective), in the same order.
    A degree of 1 gives None for its group; with ep = 1 the tensor-parallel group is the whole world."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != tp * ep:
        raise ValueError(f"world size {world} != tp {tp} x ep {ep}")
    if ep == 1:
        return (dist.group.WORLD if tp > 1 else None), None
    if tp == 1:
        return None, dist.group.WORLD
    tp_group = ep_group = None
    for e in range(ep):  # every process creates every group, in the same order
        group = dist.new_group([e * tp + t for t in range(tp)])
        if rank // tp == e:
            tp_group = group
    for t in range(tp):
        group = dist.new_group([e * tp + t for e in range(ep)])
        if rank % tp == t:
            ep_group = group
    return tp_group, ep_group
