"""The optimizer: torch.optim.AdamW (fused) after torch's clip_grad_norm_, and what a tensor-parallel step does to
the gradients before them.

Mirrors jax_impl/optimizer.py (spec/training.py fixes the settings). With tensor parallelism each rank holds
slices of the gradients: a kv head that several ranks hold gets a gradient from each holder's query heads only
(`sum_replicated_blocks` sums them), and the clipping norm is taken over every rank's slices with each element
counted once (`clip_grad_norm`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from spec.parallel import holders, replicated_block
from spec.params import runtime_groups
from spec.training import AdamW, decays
from torch_impl.model import CausalLM


def runtime_names(model: CausalLM) -> dict[str, tuple[str, str]]:
    """Parameter name -> (module, role) of the parameter table; a tied head appears once (the embedding)."""
    names = {}
    for name, _ in model.named_parameters():
        module, role = name.rsplit(".", 1)
        names[name] = (module, role)
    return names


def make_optimizer(model: CausalLM, config: AdamW) -> torch.optim.AdamW:
    """torch.optim.AdamW with two groups: 2-D weights decay, norms and biases do not (spec/training.py).

    `fused=True`: one kernel updates each parameter in place (the unfused loop allocates two temporaries the size
    of every parameter per step, the embedding's included); it is transformers' Trainer default with torch >= 2.8
    (`adamw_torch_fused`), and parity/hf_training.py's reference uses it too, so the two step the same arithmetic.
    """
    kinds = {key: entries[0].kind for key, entries in runtime_groups(model.spec).items()}
    keys = runtime_names(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if decays(kinds[keys[name]]) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, fused=True)


def clip_grad_norm(model: CausalLM, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ of every parameter (scale by max_norm / (norm + 1e-6) when below 1); over the
    ranks' slices for a tensor-parallel model. Returns the norm."""
    if model.layout.tp == 1:
        return torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_norm, foreach=False)
    return _clip_over_ranks(model, max_norm)


def _entries(model: CausalLM) -> list[tuple[torch.nn.Parameter, list]]:
    """Every parameter with its checkpoint entries (the partition table's rows it packs)."""
    groups, keys = runtime_groups(model.spec), runtime_names(model)
    return [(p, groups[keys[name]]) for name, p in model.named_parameters()]


def sum_replicated_blocks(model: CausalLM) -> None:
    """Replicated kv heads (tp > num_key_value_heads): each holder's gradient comes from its own query heads
    only, so the block's gradient is the sum over its holders, and every holder steps with that sum (the
    replicas stay equal). One all-reduce of a [n_kv, size] buffer in which each rank fills its own block's row.
    Every other tensor's gradient is already whole on each rank (tensor_parallel.py's autograd-aware
    collectives; per-head q/k norms: layernorm.py)."""
    tp, rank = model.layout.tp, model.layout.rank
    if tp == 1:
        return
    found = [(p, e[0]) for p, e in _entries(model) if p.grad is not None and replicated_block(e[0], tp)]
    if not found:
        return
    units = {entry.units for _, entry in found}
    if len(units) != 1:
        raise AssertionError(f"replicated blocks of different counts {sorted(units)}: expected the kv heads only")
    n_blocks = units.pop()
    size = sum(p.grad.numel() for p, _ in found)
    buffer = torch.zeros(n_blocks, size, dtype=torch.float32, device=found[0][0].grad.device)  # [n_kv, size]
    block, offset = rank * n_blocks // tp, 0
    for p, _ in found:
        buffer[block, offset : offset + p.grad.numel()] = p.grad.reshape(-1)
        offset += p.grad.numel()
    dist.all_reduce(buffer, group=model.group)
    offset = 0
    for p, _ in found:
        p.grad.copy_(buffer[block, offset : offset + p.grad.numel()].view_as(p.grad))
        offset += p.grad.numel()


def _clip_over_ranks(model: CausalLM, max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_ over the whole model's gradient, which the ranks hold in slices: the squared norm is
    the all-reduced sum of every rank's squares, each divided by how many ranks hold that element (spec/parallel.py
    `holders`: norms on all of them, a replicated kv head on tp / n_kv), so each element counts once. Returns the
    norm, as clip_grad_norm_ does."""
    tp = model.layout.tp
    squares = torch.zeros((), dtype=torch.float64, device=model.model.embed_tokens.weight.device)  # nccl: on the GPU
    grads = []
    for p, entries in _entries(model):
        if p.grad is not None:
            grads.append(p.grad)
            squares += p.grad.double().square().sum() / holders(entries[0], tp)
    dist.all_reduce(squares, group=model.group)
    coef = torch.clamp(max_norm / (squares.sqrt() + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return squares.sqrt()


__all__ = ["clip_grad_norm", "make_optimizer", "runtime_names", "sum_replicated_blocks"]
