"""What every rank runs in tests/torch_impl/test_tensor_parallel.py's launch: the inputs, a recorder of tensor shapes
and the per-rank workers (`all_rank_checks` and the checks it runs), returning plain data that the test asserts on.

Spawning a process group costs seconds on a small CPU, so each degree spawns once and one worker runs every check on
every rank. The twin of tests/jax_impl/tp_script.py and tp_train_script.py (JAX's measuring side, in a subprocess).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import torch_impl
from spec import InputError
from torch_impl.vocab_parallel import gather_logits, greedy_token

IDS = np.array([[0, 0, 0, 5, 17, 250, 3], [11, 262, 1, 2, 3, 4, 100]])  # row 0 left-padded by MASK
MASK = np.array([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
PROMPTS = [[5, 17, 250, 3], [11, 262, 1, 2, 3, 4, 100], [42]]  # ragged: generate left-pads them
NEW_TOKENS = 6
SAMPLING = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 3}


class ShapeRecorder(TorchDispatchMode):
    """Records the shape of every tensor that any aten op (factories and collectives included) takes or makes."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves((args, kwargs, out)):
            if isinstance(leaf, torch.Tensor):
                self.shapes.append((str(func), tuple(leaf.shape)))
        return out

    def vocabulary_sized(self, vocab: int, padded: int) -> list[tuple[str, tuple[int, ...]]]:
        """Tensors with a whole vocabulary along some dim, flattened ones included (a multiple of V or V_pad)."""

        def full(d: int) -> bool:
            return any(d >= v and d % v == 0 for v in (vocab, padded))

        return sorted({(op, shape) for op, shape in self.shapes if any(full(d) for d in shape)})

    def at_least(self, size: int) -> list[tuple[str, tuple[int, ...]]]:
        return sorted({(op, shape) for op, shape in self.shapes if any(d >= size for d in shape)})


def _rank_checks(cases: list[tuple[str, bool]]) -> tuple[list[list[dict]], list[list[int]]]:
    """On every rank, for each (checkpoint, also_bf16): facts and results; rank 0 returns [case][rank].

    Also greedy_token on crafted shards of 4 ids per rank, one row each: every rank ties at its local
    id 1 (global 1 must win); the max only on the last rank (at its local id 2); a tie between rank 0's
    id 3 and the last rank's first id (3 must win).
    """
    rank, tp = dist.get_rank(), dist.get_world_size()
    crafted = torch.zeros(3, 4)
    crafted[0, 1] = 5.0
    crafted[1, 2] = 7.0 if rank == tp - 1 else 1.0
    crafted[2, 3 if rank == 0 else 0] = 2.0 if rank in (0, tp - 1) else 1.0
    ties = greedy_token(crafted, 4 * rank).tolist()
    results = []
    for path, also_bf16 in cases:
        model = torch_impl.from_pretrained(path, group=dist.group.WORLD)
        v, group, out = model.spec.vocab_size, model.group, {}
        real = min(max(v - model.layout.vocab_start, 0), model.layout.vocab_shard)  # this shard's real rows
        weights = list(model.parameters())  # de-duplicated: a tied head is not a second tensor
        out["tied_is_embedding"] = model.lm_head.weight is model.model.embed_tokens.weight
        out["n_vocab_tensors"] = sum(p.shape[0] == model.layout.vocab_shard for p in weights)
        out["embed_shape"] = tuple(model.model.embed_tokens.weight.shape)
        out["numel"] = sum(p.numel() for p in weights)
        with torch.inference_mode():
            local = model(IDS, attention_mask=MASK)
            out["local_logits_shape"] = tuple(local.shape)
            out["n_padding"] = local.shape[-1] - real
            out["padding_is_neg_inf"] = bool(torch.isneginf(local[..., real:]).all())
            out["logits"] = gather_logits(local, v, group).numpy()
            with ShapeRecorder() as greedy:
                out["tokens"] = torch_impl.generate(model, PROMPTS, NEW_TOKENS, eos_token_ids=()).tokens
            out["greedy_full_vocab"] = greedy.at_least(v)
            out["greedy_ops"] = len(greedy.shapes)
            with ShapeRecorder() as control:  # the detector must see the explicit gather
                gather_logits(local[:, -1], v, group)
            out["control_full_vocab"] = control.at_least(v)
            sampled = torch_impl.generate(model, PROMPTS, NEW_TOKENS, eos_token_ids=(), return_logits=True, **SAMPLING)
            out["sampled"], out["sampled_logits"] = sampled.tokens, sampled.logits
            for bad in (v, model.layout.padded_vocab - 1, -1):  # past V (some inside the padding), negative
                try:
                    model([[1, bad]])
                    out.setdefault("bad_ids", []).append(None)
                except InputError as err:
                    out.setdefault("bad_ids", []).append(str(err))
        if also_bf16:
            model = torch_impl.from_pretrained(path, "bfloat16", group=dist.group.WORLD)
            with torch.inference_mode():
                out["logits_bf16"] = gather_logits(model(IDS, attention_mask=MASK), v, group).float().numpy()
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, out)
        results.append(gathered)
    return results, ties


def _grad_checks(path: str) -> dict:
    """On every rank: the loss and gradients of the sharded model, recording every tensor the step touches."""
    from torch_impl.training import loss, loss_and_grads

    model = torch_impl.from_pretrained(path, group=dist.group.WORLD)
    sizes = (model.spec.vocab_size, model.layout.padded_vocab)
    with ShapeRecorder() as record:  # the forward, the loss and the backward (not the final gather of results)
        model.requires_grad_(True)
        loss(model, IDS, attention_mask=MASK).backward()
        model.requires_grad_(False)
    with torch.inference_mode(), ShapeRecorder() as control:  # the detector does see an explicit gather
        gather_logits(model(IDS, attention_mask=MASK), model.spec.vocab_size, model.group)
    value, grads = loss_and_grads(model, IDS, attention_mask=MASK)
    return {
        "loss": value,
        "grads": grads,
        "full_vocab": record.vocabulary_sized(*sizes),
        "control": control.vocabulary_sized(*sizes),
        "ops": len(record.shapes),
    }


STEPS = 3


def _train_checks(path: str, batches: list[np.ndarray], config) -> dict:
    """On every rank: the clipping norm of one backward, then `STEPS` AdamW steps, the parameters put together,
    and every rank's copy of the tensors several ranks hold (norms, replicated kv heads), which must stay equal."""
    from torch_impl import optimizer as opt
    from torch_impl import training

    model = torch_impl.from_pretrained(path, group=dist.group.WORLD)
    model.requires_grad_(True)
    training.loss(model, batches[0], attention_mask=MASK).backward()
    opt.sum_replicated_blocks(model)
    norm = float(opt.clip_grad_norm(model, 1e9))  # coefficient 1: the norm alone
    model.zero_grad(set_to_none=True)
    optimizer = training.make_optimizer(model, config)
    losses = [training.train_step(model, optimizer, config, ids, attention_mask=MASK) for ids in batches]
    held = ("k_proj", "v_proj", "norm")  # kv heads (replicated at this degree), norms (whole on every rank)
    copies = {name: p.detach().numpy().copy() for name, p in model.named_parameters() if any(h in name for h in held)}
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, copies)
    return {"norm": norm, "losses": losses, "after": training.parameters(model), "copies": every}


def all_rank_checks(cases: list[tuple[str, bool]], path: str, batches: list[np.ndarray], config) -> dict:
    """On every rank: `_rank_checks` of `cases`, then `_grad_checks` of `path` and `_train_checks` on a fresh copy of
    it: one launch of the ranks per degree (a launch is `tp` processes importing torch, ~5-10 s of CI each)."""
    forward, ties = _rank_checks(cases)
    return {
        "forward": forward,
        "ties": ties,
        "grads": _grad_checks(path),
        "train": _train_checks(path, batches, config),
    }
