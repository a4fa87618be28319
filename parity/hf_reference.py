"""Hugging Face transformers as an optional third, independent reference (`--reference hf`).

transformers shares no code with either backend: its own config parsing, weight loading, RoPE, attention
and norms. It exposes fewer components than our traces (parity/components.py: `hf_components`), so the
comparison is held on those: the embedding, x2 of every layer but the last, the final norm and the logits.
The eager attention implementation is used: it is transformers' plain reference code, the same on every
device, where sdpa dispatches to device-specific kernels.

A mixture-of-experts model's sparse layers are seen through forward hooks (`_MoEHooks`): the router
(`model.model.layers[i].mlp.gate` in all three families in transformers 5, Mixtral included, returning
(logits, weights, indices)), the stacked experts, the shared expert and its gate, and the block's output. With
`routing` (teacher-forced, layer -> ids [B, T, k]) the router hook replaces transformers' own choice by the given
ids, with the weights recomputed as transformers' router computes them (its float32 softmax gathered at the ids,
renormalized where the family does, cast to the logits' dtype except in Mixtral).
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from pathlib import Path

import numpy as np

from parity.components import hf_components
from parity.trace import Capture, release_memory
from spec import InputError


def hf_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


@contextlib.contextmanager
def _quiet_transformers(progress: bool):
    """Silence transformers' own progress bars and info logging unless progress was asked for."""
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def load_hf(checkpoint: str | Path, dtype: str, *, progress: bool = False):
    """transformers' model for `checkpoint` at `dtype`, eager attention, in eval mode (no dropout)."""
    if not hf_available():
        raise InputError(
            "--reference hf needs Hugging Face transformers, which is not installed (pip install 'decoder-parity[hf]')"
        )
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    with _quiet_transformers(progress):
        try:
            model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch_dtype, attn_implementation="eager")
        except (OSError, ValueError, KeyError) as err:
            raise InputError(f"transformers cannot load {checkpoint}: {err}") from err
    return model.eval()


def capture_hf(
    checkpoint: str | Path,
    ids: np.ndarray,
    *,
    dtype: str,
    progress: bool = False,
    routing: dict[int, np.ndarray] | None = None,
) -> Capture:
    """Run transformers' model for `checkpoint` at `dtype` and return the components it exposes.

    routing: sparse layer -> expert ids [B, T, k] to use instead of transformers' own (teacher-forced)."""
    start = time.perf_counter()
    model = load_hf(checkpoint, dtype, progress=progress)  # refuses first when transformers is missing
    loaded = time.perf_counter()
    import torch

    hooks = _MoEHooks(model, ids.shape, routing or {})
    try:
        with torch.inference_mode():
            out = model(torch.as_tensor(ids, dtype=torch.long), output_hidden_states=True)
    finally:
        hooks.remove()
    run = time.perf_counter() - loaded
    hidden = out.hidden_states
    num_layers = len(hidden) - 1
    names = hf_components(num_layers)
    # hidden_states: [embedding, x2 of layers 0 .. L-2, final norm output]; then the logits.
    tensors = [*hidden, out.logits]
    trace = {name: t.detach().float().cpu().numpy() for name, t in zip(names, tensors, strict=True)}
    trace.update(hooks.trace)
    del model, out, hidden, tensors, hooks
    release_memory()
    return Capture("hf", dtype, "-", trace, loaded - start, run)


class _MoEHooks:
    """Forward hooks on every sparse layer's router, experts, shared expert and block: the moe.* components."""

    def __init__(self, model, shape: tuple[int, int], routing: dict[int, np.ndarray]):
        self.shape, self.trace, self.handles = tuple(shape), {}, []
        for i, layer in enumerate(getattr(getattr(model, "model", None), "layers", [])):  # GPT-NeoX: no .model
            mlp = layer.mlp
            if not hasattr(mlp, "experts"):
                continue  # a dense layer
            forced = routing.get(i)
            self.handles.append(mlp.gate.register_forward_hook(self._router(i, mlp.gate, forced)))
            self.handles.append(mlp.experts.register_forward_hook(self._keep(f"layers.{i}.moe.experts_out")))
            self.handles.append(mlp.register_forward_hook(self._keep(f"layers.{i}.mlp_out")))
            if getattr(mlp, "shared_expert", None) is not None:
                parts: dict = {}
                self.handles.append(mlp.shared_expert.register_forward_hook(self._part(parts, "out")))
                self.handles.append(mlp.shared_expert_gate.register_forward_hook(self._shared(i, parts)))

    def _store(self, name: str, tensor) -> None:
        self.trace[name] = tensor.detach().float().cpu().numpy().reshape(*self.shape, -1)

    def _keep(self, name: str):
        return lambda _module, _inputs, output: self._store(name, output)

    def _part(self, parts: dict, key: str):
        def hook(_module, _inputs, output):
            parts[key] = output

        return hook

    def _shared(self, layer: int, parts: dict):
        def hook(_module, _inputs, gate):
            import torch.nn.functional as F

            self._store(
                f"layers.{layer}.moe.shared_out", F.sigmoid(gate) * parts.pop("out")
            )  # as Qwen2MoeSparseMoeBlock

        return hook

    def _router(self, layer: int, gate, forced: np.ndarray | None):
        def hook(_module, _inputs, output):
            import torch

            logits, weights, indices = output
            if forced is not None:
                indices = torch.as_tensor(np.asarray(forced).reshape(-1, gate.top_k), dtype=torch.long)
                probs = torch.nn.functional.softmax(logits.float(), dim=-1)
                weights = probs.gather(-1, indices)
                if getattr(gate, "norm_topk_prob", True):  # Mixtral's router has no flag: it always renormalizes
                    weights = weights / weights.sum(dim=-1, keepdim=True)
                if hasattr(gate, "norm_topk_prob"):  # Qwen rounds the weights to the logits' dtype, Mixtral does not
                    weights = weights.to(logits.dtype)
            prefix = f"layers.{layer}.moe."
            for name, value in (("router_logits", logits), ("topk_ids", indices), ("topk_weights", weights)):
                self._store(prefix + name, value)
            return (logits, weights, indices) if forced is not None else None

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
