"""The sparse (mixture-of-experts) block: a router picks k experts per token, each a gated MLP, and their outputs
are summed with the routing weights; Qwen2-MoE adds a shared expert behind a sigmoid gate.

Mirrors jax_impl/moe.py and transformers' Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock / MixtralSparseMoeBlock:

    router_logits = x Wr^T                                 [N, E], the activation dtype (F.linear)
    probs = softmax(float32(router_logits))                [N, E] float32
    topk_weights, topk_ids = top_k(probs, k)               ties: the lower expert index first (both backends)
    topk_weights /= sum(topk_weights)                      norm_topk_prob (Mixtral: always)
    topk_weights -> activation dtype                       Qwen; Mixtral keeps them float32 (router_weights_float32)
    experts_out[n] = sum_j to_dtype(w[n, j] * expert_{ids[n, j]}(x_n)), accumulated in expert order

torch.topk breaks ties arbitrarily on the CPU (measured: [.2, .2, .2, .2] -> ids 1, 3, 0), so the top-k is a
stable descending sort, which keeps equal probabilities in index order as jax.lax.top_k does.

Dispatch (`Experts`): the (token, slot) pairs are sorted by expert, gathered once, and each expert that has
tokens runs one product over its contiguous rows, then the weighted rows are added back per token
(`index_add_`, in expert order as transformers adds them). A decode step touches only the selected experts'
weights. Under tensor parallelism each expert holds its slice of moe_intermediate_size (its rows of
gate_up, columns of down, like a dense MLP); under expert parallelism (torch_impl/expert_parallel.py) a rank
holds a contiguous run of whole experts. Either way a rank's `experts_out` is a partial sum, reduced once
per block over the groups in `reduce_groups`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from spec import ModelSpec
from spec.inputs import check_routing as spec_check_routing
from torch_impl.activation import GATED
from torch_impl.linear import Linear, linear
from torch_impl.mlp import MLP
from torch_impl.tensor_parallel import reduce_from_ranks, sum_grad_over_ranks


class StackedLinear(nn.Module):
    """E bias-free Linears stacked on a leading axis: `weight` [E, out, in] (torch layout, per expert)."""

    def __init__(self, experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, out_features, in_features))


def top_k(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) of the k largest along the last axis, descending; equal values: the lower index first."""
    values, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    return values[..., :k], ids[..., :k]


def check_routing(
    routing: dict[int, object] | None, spec: ModelSpec, batch: int, length: int, device: torch.device
) -> dict[int, torch.Tensor] | None:
    """Teacher-forced expert ids {sparse layer: [B, T, k] integers in [0, E), distinct per token} -> int64 tensors
    on `device`, checked by the twins' shared rules (spec.inputs.check_routing), so both backends refuse bad ids
    with the same words."""
    checked = spec_check_routing(routing, spec, batch, length)
    if checked is None:
        return None
    return {layer: torch.as_tensor(ids.astype(np.int64), device=device) for layer, ids in checked.items()}


class Experts(nn.Module):
    """This rank's experts `first .. first + count - 1` (global indices), each a gated MLP of width `width`."""

    def __init__(self, spec: ModelSpec, count: int, width: int, *, first: int = 0, kernels: str = "reference"):
        super().__init__()
        self.first, self.count = first, count
        h = spec.hidden_size
        self.gate_up_proj = StackedLinear(count, h, 2 * width)  # [count, 2W, H]: gate rows, then up rows
        self.down_proj = StackedLinear(count, width, h)  # [count, H, W]
        self.act_fn = GATED[spec.hidden_act](kernels=kernels)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H], ids [N, k] global expert indices, weights [N, k] -> this rank's sum over its experts [N, H]."""
        if x.shape[0] == 1:
            return self._one_token(x, ids, weights)
        return self._grouped(x, ids, weights)

    def _grouped(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """forward() for any number of tokens: the (token, slot) pairs grouped by expert (the module docstring)."""
        k = ids.shape[1]
        flat = ids.reshape(-1) - self.first  # [N * k] local index; outside [0, count): another rank's expert
        slots = ((flat >= 0) & (flat < self.count)).nonzero()[:, 0]  # [M] this rank's (token, slot) pairs
        experts = flat[slots]
        order = torch.argsort(experts, stable=True)  # by expert; within one, by token
        slots, experts = slots[order], experts[order]  # [M]
        tokens = slots // k  # [M]
        rows = x[tokens]  # [M, H]: one gather
        counts = torch.bincount(experts, minlength=self.count).tolist()
        # unbind, not weight[e] per expert: its backward stacks the experts' gradients once, where indexing would
        # allocate a zero [E, ...] gradient for every expert used
        gate_up, down = self.gate_up_proj.weight.unbind(0), self.down_proj.weight.unbind(0)
        outs, start = [], 0
        for e, n in enumerate(counts):  # only the experts that have tokens: their weights alone are read
            if n:
                act = self.act_fn(linear(rows[start : start + n], gate_up[e]))  # [n, W]
                outs.append(linear(act, down[e]))  # [n, H]
                start += n
        out = torch.zeros_like(x)
        if outs:
            ys = torch.cat(outs) * weights.reshape(-1)[slots][:, None]  # [M, H]; float32 where the weights are
            out = out.index_add(0, tokens, ys.to(x.dtype))
        return out

    def _one_token(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """forward() for one token (a batch-1 decode step): the k ids read on the host once, then the same
        products without the device-side sort and gather, whose per-call cost is most of a small step.
        Bit-identical to _grouped: each expert gets one row either way, and the weighted rows are summed by the
        same index_add in expert order (for bfloat16 it accumulates in float32 before rounding, as
        transformers' own index_add_ does, so a chain of `+` would not match it)."""
        gate_up, down = self.gate_up_proj.weight.unbind(0), self.down_proj.weight.unbind(0)
        chosen = sorted((e - self.first, j) for j, e in enumerate(ids[0].tolist()))  # by expert
        ys = [
            linear(self.act_fn(linear(x, gate_up[e])), down[e]) * weights[:, j : j + 1]  # [1, H]; [1, 1] promotes
            for e, j in chosen
            if 0 <= e < self.count  # else another rank's expert
        ]
        if not ys:
            return torch.zeros_like(x)
        rows = torch.zeros(len(ys), dtype=torch.long, device=x.device)  # [m]: every row is token 0
        return torch.zeros_like(x).index_add(0, rows, torch.cat(ys).to(x.dtype))  # [1, H]


class SparseMoeBlock(nn.Module):
    """Router, experts and (Qwen2-MoE) the shared expert of sparse layer `layer_idx`.

    `spec` is the whole model's; `tp` splits each expert's width over `group`; `experts` is the range of global
    expert indices this rank holds (expert parallelism, `ep_group`); `reduce_groups` are the groups over which
    the partial expert outputs are summed."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        *,
        kernels: str = "reference",
        tp: int = 1,
        group: dist.ProcessGroup | None = None,
        experts: range | None = None,
        ep_group: dist.ProcessGroup | None = None,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        self.k, self.norm_topk_prob = spec.num_experts_per_tok, spec.norm_topk_prob
        self.weights_float32 = spec.router_weights_float32
        experts = range(spec.num_experts) if experts is None else experts
        h = spec.hidden_size
        self.router = Linear(h, spec.num_experts, bias=False)  # replicated on every rank
        self.experts = Experts(
            spec, len(experts), spec.moe_intermediate_size // tp, first=experts.start, kernels=kernels
        )
        self.reduce_groups = ([group] if tp > 1 else []) + ([ep_group] if len(experts) < spec.num_experts else [])
        self.shared = spec.shared_expert_intermediate_size > 0
        if self.shared:
            si = spec.shared_expert_intermediate_size // tp
            self.shared_expert = MLP(spec, layer_idx, kernels=kernels, tp=tp, group=group, intermediate_size=si)
            self.shared_expert_gate = Linear(h, 1, bias=False)

    def route(
        self, x: torch.Tensor, forced: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [N, H] -> (router_logits [N, E], topk_ids [N, k], topk_weights [N, k]); `forced` ids replace the
        top-k, and the weights are the probabilities at those ids."""
        logits = self.router(x)  # [N, E] in the activation dtype, as transformers
        probs = torch.softmax(logits.float(), dim=-1)  # [N, E]
        if forced is None:
            weights, ids = top_k(probs, self.k)
        else:
            ids, weights = forced, probs.gather(-1, forced)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if not self.weights_float32:
            weights = weights.to(logits.dtype)
        return logits, ids, weights

    def forward(
        self,
        x: torch.Tensor,
        trace: dict[str, torch.Tensor] | None = None,
        routing: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [B, T, H] -> [B, T, H]; `routing`: teacher-forced expert ids [B, T, k] (checked by the caller)."""
        b, t, h = x.shape
        flat = x.reshape(-1, h)  # [N, H]
        forced = None if routing is None else routing.reshape(-1, self.k)  # [N, k]
        logits, ids, weights = self.route(flat, forced)
        experts_in = flat
        for group in self.reduce_groups:  # each rank's partial output depends on x and the weights: sum dL/d them
            experts_in = sum_grad_over_ranks(experts_in, group)
            weights = sum_grad_over_ranks(weights, group)
        out = self.experts(experts_in, ids, weights)  # [N, H]
        if self.reduce_groups:
            total = out.float() if out.dtype in (torch.float16, torch.bfloat16) else out
            for group in self.reduce_groups:
                total = reduce_from_ranks(total, group)
            out = total.to(x.dtype)
        name = f"layers.{self.layer_idx}.moe"
        if trace is not None:
            trace[f"{name}.router_logits"] = logits.view(b, t, -1)
            trace[f"{name}.topk_ids"] = ids.to(torch.int32).view(b, t, -1)
            trace[f"{name}.topk_weights"] = weights.view(b, t, -1)
            trace[f"{name}.experts_out"] = out.view(b, t, h)
        if self.shared:
            shared = torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)  # [N, H]
            if trace is not None:
                trace[f"{name}.shared_out"] = shared.view(b, t, h)
            out = out + shared
        return out.view(b, t, h)
