"""Hugging Face transformers as an optional third, independent reference (`--reference hf`).

transformers shares no code with either backend: its own config parsing, weight loading, RoPE, attention
and norms. It exposes fewer components than our traces (parity/components.py: `hf_components`), so the
comparison is held on those: the embedding, x2 of every layer but the last, the final norm and the logits.
The eager attention implementation is used: it is transformers' plain reference code, the same on every
device, where sdpa dispatches to device-specific kernels.
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


def capture_hf(checkpoint: str | Path, ids: np.ndarray, *, dtype: str, progress: bool = False) -> Capture:
    """Run transformers' model for `checkpoint` at `dtype` and return the components it exposes."""
    start = time.perf_counter()
    model = load_hf(checkpoint, dtype, progress=progress)  # refuses first when transformers is missing
    loaded = time.perf_counter()
    import torch

    with torch.inference_mode():
        out = model(torch.as_tensor(ids, dtype=torch.long), output_hidden_states=True)
    run = time.perf_counter() - loaded
    hidden = out.hidden_states
    num_layers = len(hidden) - 1
    names = hf_components(num_layers)
    # hidden_states: [embedding, x2 of layers 0 .. L-2, final norm output]; then the logits.
    tensors = [*hidden, out.logits]
    trace = {name: t.detach().float().cpu().numpy() for name, t in zip(names, tensors, strict=True)}
    del model, out, hidden, tensors
    release_memory()
    return Capture("hf", dtype, "-", trace, loaded - start, run)
