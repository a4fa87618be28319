"""transformers as the third, independent opinion on training: its own loss, gradients and torch's AdamW.

The loss is transformers' own (`model(ids, labels=...)`: it shifts the labels, ignores -100 and averages in
float32), the gradients are its autograd's, and the optimizer is torch.optim.AdamW with the same groups and
settings as torch_impl (spec/training.py), so `check --grad --reference hf` compares three implementations
that share no model code. transformers' parameter names are the checkpoint's (up to the renames below), so
gradients compare by name; a mixture-of-experts model keeps its experts stacked in memory ([E, 2I, H], as the
backends do), and each checkpoint name is a view of one expert's rows of that tensor.
Positions are passed explicitly (each token's count of real tokens before it), as both backends compute
them: transformers would otherwise number a left-padded row's tokens from the first pad.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.hf_reference import load_hf
from spec import ModelSpec
from spec.params import param_table
from spec.training import AdamW, check_batch, decays

# transformers 5 renames some tensors between the file and the module (a WeightRenaming applied at load and
# reversed at save): in memory GPT-NeoX's head is `lm_head`, in the checkpoint `embed_out`; Mixtral's router
# `mlp.gate`, in the checkpoint `block_sparse_moe.gate`. Stacked experts are handled by `_views`.
_CHECKPOINT_TO_IN_MEMORY = {"gpt_neox": [("embed_out.", "lm_head.")], "mixtral": [(".block_sparse_moe.", ".mlp.")]}


def _views(model_spec: ModelSpec) -> dict[str, list[tuple[str, tuple]]]:
    """transformers' in-memory parameter name -> [(checkpoint name, index of that tensor within it)]."""
    views: dict[str, list[tuple[str, tuple]]] = {}
    for entry in param_table(model_spec):
        if entry.expert is None:
            name = entry.name
            for old, new in _CHECKPOINT_TO_IN_MEMORY.get(model_spec.model_type, []):
                name = name.replace(old, new)
            views.setdefault(name, []).append((entry.name, ()))
        else:  # one expert's rows of the stacked [E, parts * out, in] tensor, named after our runtime module
            rows = entry.shape[0]
            index = (entry.expert, slice(entry.part * rows, (entry.part + 1) * rows))
            views.setdefault(entry.module, []).append((entry.name, index))
    return views


def checkpoint_named_parameters(model, model_spec: ModelSpec) -> dict[str, tuple]:
    """Checkpoint name -> (transformers' parameter, the index of that tensor in it), every parameter accounted for.

    A tied head appears once (under the embedding's name). A parameter the table does not name is an error
    here, not silently left out of the comparison or the optimizer."""
    views = _views(model_spec)
    named, unknown = {}, []
    for name, param in model.named_parameters():
        if name not in views:
            unknown.append(name)
        for checkpoint_name, index in views.get(name, []):
            named[checkpoint_name] = (param, index)
    if unknown:
        raise AssertionError(f"transformers parameters the table does not name: {unknown}")
    return named


def _unique(named: dict[str, tuple]) -> dict[str, object]:
    """One entry per underlying parameter (stacked experts appear under many names): what an optimizer takes."""
    return {id(param): (name, param) for name, (param, _) in reversed(named.items())}


def _batch(model_spec: ModelSpec, ids: np.ndarray, labels, attention_mask):
    import torch

    batch = check_batch(ids, labels, model_spec, attention_mask)
    ids, mask, counted = batch.ids, batch.mask.astype(np.int64), batch.labels
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    as_long = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.long)  # noqa: E731
    return {
        "input_ids": as_long(ids),
        "attention_mask": as_long(mask),
        "position_ids": as_long(positions),
        "labels": as_long(counted),
    }


def hf_loss_and_grads(
    checkpoint: str | Path, ids: np.ndarray, *, dtype: str, labels=None, attention_mask=None
) -> tuple[float, dict[str, np.ndarray]]:
    """transformers' loss and every parameter's gradient by checkpoint name (float32 numpy, [out, in])."""
    model_spec = ModelSpec.from_pretrained(checkpoint)
    model = load_hf(checkpoint, dtype)
    out = model(**_batch(model_spec, ids, labels, attention_mask))
    out.loss.backward()
    named = checkpoint_named_parameters(model, model_spec)  # a tied head once: its gradient holds both uses
    return float(out.loss.detach()), {name: p.grad[i].float().numpy().copy() for name, (p, i) in named.items()}


class HFTrainer:
    """transformers' model and torch.optim.AdamW set up as torch_impl's (the same groups and settings, fused as
    transformers' Trainer runs it by default with torch >= 2.8)."""

    def __init__(self, checkpoint: str | Path, config: AdamW, *, dtype: str):
        import torch

        self.spec = ModelSpec.from_pretrained(checkpoint)
        self.config = config
        self.model = load_hf(checkpoint, dtype)
        kinds = {e.name: e.kind for e in param_table(self.spec)}
        self.named = checkpoint_named_parameters(self.model, self.spec)
        params = _unique(self.named).values()  # a stacked experts tensor once, its kind that of its rows
        decay = [p for n, p in params if decays(kinds[n])]
        rest = [p for n, p in params if not decays(kinds[n])]
        groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}]
        betas = (config.beta1, config.beta2)
        self.optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=config.eps, fused=True)

    def step(self, ids: np.ndarray, attention_mask=None) -> float:
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        out = self.model(**_batch(self.spec, ids, None, attention_mask))
        out.loss.backward()
        if self.config.max_grad_norm is not None:
            params = [p for _, p in _unique(self.named).values()]
            torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm, foreach=False)
        self.optimizer.step()
        return float(out.loss.detach())

    def parameters(self) -> dict[str, np.ndarray]:
        return {n: p.detach()[i].float().numpy().copy() for n, (p, i) in self.named.items()}


def hf_train(
    checkpoint: str | Path, batches: list[np.ndarray], config: AdamW, *, dtype: str, attention_mask=None
) -> tuple[list[float], dict[str, np.ndarray]]:
    """AdamW steps on transformers' model, one per batch: (losses, parameters by checkpoint name after)."""
    trainer = HFTrainer(checkpoint, config, dtype=dtype)
    losses = [trainer.step(ids, attention_mask) for ids in batches]
    return losses, trainer.parameters()
