"""Load a Hugging Face-layout safetensors checkpoint into `jax_impl.CausalLM`.

Mirrors torch_impl/loader.py. The model is built abstractly (`nnx.eval_shape`: no random init, no
memory), then each runtime parameter from `spec.runtime_params` (validated, gate/up packed) is placed on
the device in the requested dtype, one at a time. This is the one place where the layout changes:
torch and the checkpoint keep a Linear weight as [out, in]; Flax's `kernel` is [in, out], so LINEAR
kinds are transposed here and nowhere else.

With a `mesh` the same loop runs once per "model" coordinate r, reading rank r's slice of every tensor
from the memory map (spec/parallel.py, as a torch rank does), and the slices are assembled into global
arrays placed by the partition table (jax_impl/tensor_parallel.py): a device receives only its own slice.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jax_impl import tensor_parallel
from jax_impl.model import CausalLM
from spec import Checkpoint, ModelSpec, dtype_name, runtime_groups, runtime_params
from spec.generation import eos_token_ids
from spec.parallel import ShardLayout, check_ep_degree, expert_range
from spec.params import LINEAR

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_FLAX_ATTR = {("linear", "weight"): "kernel", ("bias", "bias"): "bias"}  # norm/embedding keep "weight"


def from_pretrained(
    path: str | Path,
    dtype: jnp.dtype | str = jnp.float32,
    *,
    kernels: str = "reference",
    progress: bool = False,
    mesh: Mesh | None = None,
) -> CausalLM:
    """Build the model for the checkpoint directory `path` and load its weights (`progress` on stderr).

    With a `mesh` (jax_impl/tensor_parallel.py) every parameter is placed shard by shard over its "model" axis,
    and stacked experts over its "expert" axis if it has one (jax_impl/expert_parallel.py).
    """
    dtype = DTYPES[dtype_name(dtype)]
    spec = ModelSpec.from_pretrained(path)
    checkpoint = Checkpoint(path)
    checkpoint.validate(spec)  # from the headers, before any allocation: a config that claims 10**7 layers fails here
    tp, ep = tensor_parallel.mesh_degrees(mesh)
    ShardLayout(spec, tp)  # refuses a degree that does not fit, before anything is built
    check_ep_degree(spec, ep)
    model = nnx.eval_shape(lambda: CausalLM(spec, dtype=dtype, kernels=kernels, tp=tp, ep=ep, rngs=nnx.Rngs(0)))
    modules = {".".join(str(p) for p in path): m for path, m in nnx.iter_modules(model)}
    groups = runtime_groups(spec)
    # One stream of slices per (expert, model) coordinate, advanced together: one parameter in host memory at a
    # time. An expert coordinate's stream holds only its experts in a stacked parameter (the rest are the same).
    coords = [(q, r) for q in range(ep) for r in range(tp)]
    streams = [
        runtime_params(
            checkpoint, spec, progress=progress and q == r == 0, layout=ShardLayout(spec, tp, r),
            experts=expert_range(spec, ep, q) if ep > 1 else None,
        )
        for q, r in coords
    ]  # fmt: skip
    for per_rank in zip(*streams, strict=True):
        module, role, kind, _ = per_rank[0]
        # [out, in] -> Flax [in, out]; stacked experts [E, out, in] -> [E, in, out]
        arrays = [np.swapaxes(array, -1, -2) if kind == LINEAR else array for *_, array in per_rank]
        if mesh is None:
            value = jnp.asarray(arrays[0], dtype=dtype)
        else:  # cast on the host, then each device receives only its rank's slice
            pspec = tensor_parallel.partition_spec(groups[(module, role)][0], arrays[0].ndim, ep)
            pieces = {at: np.asarray(a, dtype=dtype) for at, a in zip(coords, arrays, strict=True)}
            value = tensor_parallel.place_shards(pieces, mesh, pspec)
        param = getattr(modules[module], _FLAX_ATTR.get((kind, role), role))
        if value.shape != param.shape:
            raise AssertionError(f"{module}.{role}: packed shape {list(value.shape)} != {list(param.shape)}")
        param.set_value(value)  # replaces the abstract ShapeDtypeStruct with the loaded array
    model.eos_token_ids = eos_token_ids(path)
    return model
