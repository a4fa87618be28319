"""Load a Hugging Face-layout safetensors checkpoint into `torch_impl.CausalLM`.

Mirrors jax_impl/loader.py. The model is built on the meta device (no random init, no memory), then each
runtime parameter from `spec.runtime_params` (validated, gate/up packed) is materialized on the target
device in the requested dtype, one at a time. torch keeps Linear weights as [out, in], the checkpoint's
own layout, so nothing is transposed here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from spec import Checkpoint, ModelSpec, runtime_params
from spec.generation import eos_token_ids
from torch_impl.model import CausalLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def to_torch(array: np.ndarray) -> torch.Tensor:
    """numpy (float32 / float16 / ml_dtypes.bfloat16) -> a CPU tensor with its own memory."""
    if array.dtype.name == "bfloat16":  # numpy has no bfloat16: move the bits, reinterpret in torch
        return torch.from_numpy(np.array(array).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(array))


def from_pretrained(
    path: str | Path,
    dtype: torch.dtype | str = torch.float32,
    *,
    device: str | torch.device = "cpu",
    kernels: str = "reference",
    progress: bool = False,
) -> CausalLM:
    """Build the model for the checkpoint directory `path` and load its weights (`progress` on stderr)."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    spec = ModelSpec.from_pretrained(path)
    checkpoint = Checkpoint(path)
    with torch.device("meta"):
        model = CausalLM(spec, kernels=kernels)
    model = model.to(dtype).to_empty(device=device)  # storage allocated, not initialized
    modules = dict(model.named_modules())
    with torch.no_grad():
        for module, role, _kind, array in runtime_params(checkpoint, spec, progress=progress):
            param: nn.Parameter = getattr(modules[module], role)
            tensor = to_torch(array)
            if tuple(tensor.shape) != tuple(param.shape):
                raise AssertionError(f"{module}.{role}: packed shape {list(tensor.shape)} != {list(param.shape)}")
            param.copy_(tensor)
        # Buffers are derived from the spec, not the checkpoint; to_empty left them uninitialized.
        model.model.rotary_emb.inv_freq = torch.from_numpy(spec.inv_freq()).to(device)
    model.eos_token_ids = eos_token_ids(path)
    model.tie_weights()  # to_empty allocated the head separately; point it back at the embedding
    return model.eval().requires_grad_(False)
