"""Run either backend (or transformers) the same way from a test: ids in, float32 numpy out."""

from __future__ import annotations

from pathlib import Path

import numpy as np

BACKENDS = ("torch", "jax")


def load(backend: str, directory: Path, dtype: str = "float32", kernels: str = "reference"):
    if backend == "torch":
        import torch_impl

        return torch_impl.from_pretrained(directory, dtype, kernels=kernels)
    import jax_impl

    return jax_impl.from_pretrained(directory, dtype, kernels=kernels)


def to_numpy(x) -> np.ndarray:
    """A float32 numpy copy of a torch tensor or a jax array (any float dtype)."""
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy()
    return np.asarray(x.astype("float32"))


def run(model, ids, **kwargs) -> np.ndarray:
    if hasattr(model, "parameters"):  # torch
        import torch

        with torch.inference_mode():
            return to_numpy(model(ids, **kwargs))
    return to_numpy(model(ids, **kwargs))


def run_hf(directory: Path, ids: np.ndarray, dtype: str = "float32", hidden_states: bool = False):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype)).eval()
    with torch.inference_mode():
        out = model(torch.as_tensor(ids), output_hidden_states=hidden_states)
    if hidden_states:
        return to_numpy(out.logits), [to_numpy(h) for h in out.hidden_states]
    return to_numpy(out.logits)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| relative to the largest magnitude of the reference b."""
    return float(np.abs(a - b).max() / np.abs(b).max())
