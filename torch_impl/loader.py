"""Load a Hugging Face-layout safetensors checkpoint into `torch_impl.CausalLM`.

Mirrors jax_impl/loader.py. The model is built on the meta device (no random init, no memory), then each
runtime parameter from `spec.runtime_params` (validated, gate/up packed) is materialized on the target
device in the requested dtype, one at a time. torch keeps Linear weights as [out, in], the checkpoint's
own layout, so nothing is transposed here. In a tensor-parallel process `group` the same loop reads only
this rank's slice of each tensor from the memory map (spec/parallel.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from spec import Checkpoint, ModelSpec, dtype_name, runtime_params
from spec.generation import eos_token_ids
from torch_impl.model import CausalLM
from torch_impl.rotary_embedding import RotaryEmbedding

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def to_torch(array: np.ndarray) -> torch.Tensor:
    """numpy (float32 / float16 / ml_dtypes.bfloat16) -> a CPU tensor over the same memory, no copy.

    The array is usually a read-only view of the checkpoint's memory map: the tensor is only ever read (the
    loader copies it into the parameter), so torch's warning about non-writable arrays is silenced here
    rather than paid for with a second copy of every weight (which slows the load: docs/benchmarks.md).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        if array.dtype.name == "bfloat16":  # numpy has no bfloat16: move the bits, reinterpret in torch
            return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
        return torch.from_numpy(array)


def from_pretrained(
    path: str | Path,
    dtype: torch.dtype | str = torch.float32,
    *,
    device: str | torch.device = "cpu",
    kernels: str = "reference",
    progress: bool = False,
    group: dist.ProcessGroup | None = None,
    ep_group: dist.ProcessGroup | None = None,
) -> CausalLM:
    """Build the model for the checkpoint directory `path` and load its weights (`progress` on stderr).

    With a process `group` (e.g. `dist.group.WORLD` under torchrun), this process loads its rank's shard of a
    tensor-parallel model over the group's ranks (torch_impl/tensor_parallel.py). With an `ep_group` it holds
    and reads only its expert-parallel rank's experts of each sparse layer (torch_impl/expert_parallel.py).
    """
    dtype = DTYPES[dtype_name(dtype)]
    spec = ModelSpec.from_pretrained(path)
    checkpoint = Checkpoint(path)
    checkpoint.validate(spec)  # from the headers, before any allocation: a config that claims 10**7 layers fails here
    tp = 1 if group is None else dist.get_world_size(group)
    with torch.device("meta"):
        model = CausalLM(spec, kernels=kernels, tp=tp, group=group, ep_group=ep_group)
    model = model.to(dtype).to_empty(device=device)  # storage allocated, not initialized
    modules = dict(model.named_modules())
    with torch.no_grad():
        show = progress and model.layout.rank == 0 and (ep_group is None or dist.get_rank(ep_group) == 0)
        shards = runtime_params(checkpoint, spec, progress=show, layout=model.layout, experts=model.experts)
        for module, role, _kind, array in shards:
            param: nn.Parameter = getattr(modules[module], role)
            tensor = to_torch(array)
            if tuple(tensor.shape) != tuple(param.shape):
                raise AssertionError(f"{module}.{role}: packed shape {list(tensor.shape)} != {list(param.shape)}")
            param.copy_(tensor)
        # Buffers are derived from the spec, not the checkpoint; to_empty left them uninitialized.
        for rotary in (m for m in model.modules() if isinstance(m, RotaryEmbedding)):  # one per RoPE kind
            rotary.inv_freq = rotary.frequencies(device)
    model.eos_token_ids = eos_token_ids(path)
    model.tie_weights()  # to_empty allocated the head separately; point it back at the embedding
    return model.eval().requires_grad_(False)
