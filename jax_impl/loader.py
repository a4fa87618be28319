"""Load a Hugging Face-layout safetensors checkpoint into `jax_impl.CausalLM`.

Mirrors torch_impl/loader.py. The model is built abstractly (`nnx.eval_shape`: no random init, no
memory), then each runtime parameter from `spec.runtime_params` (validated, gate/up packed) is placed on
the device in the requested dtype, one at a time. This is the one place where the layout changes:
torch and the checkpoint keep a Linear weight as [out, in]; Flax's `kernel` is [in, out], so LINEAR
kinds are transposed here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jax_impl import sharding
from jax_impl.model import CausalLM
from spec import Checkpoint, ModelSpec, runtime_params
from spec.generation import eos_token_ids
from spec.parallel import check_tp_degree
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

    With a `mesh` (jax_impl/sharding.py) every parameter is placed shard by shard over its "model" axis.
    """
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    spec = ModelSpec.from_pretrained(path)
    checkpoint = Checkpoint(path)
    tp = 1 if mesh is None else mesh.shape[sharding.MODEL]
    check_tp_degree(spec, tp)
    model = nnx.eval_shape(lambda: CausalLM(spec, dtype=dtype, kernels=kernels, shards=tp, rngs=nnx.Rngs(0)))
    modules = {".".join(str(p) for p in path): m for path, m in nnx.iter_modules(model)}
    for module, role, kind, array in runtime_params(checkpoint, spec, progress=progress):
        param = getattr(modules[module], _FLAX_ATTR.get((kind, role), role))
        if mesh is not None:
            array = sharding.shard_layout(spec, module, array, tp)
        array = array.T if kind == LINEAR else array  # [out, in] -> Flax [in, out]
        if mesh is None:
            value = jnp.asarray(array, dtype=dtype)
        else:  # cast on the host, then each device receives only its slice
            pspec = sharding.partition_spec(spec, module, role, kind, tp)
            value = sharding.place(np.asarray(array, dtype=dtype), mesh, pspec)
        if value.shape != param.shape:
            raise AssertionError(f"{module}.{role}: packed shape {list(value.shape)} != {list(param.shape)}")
        param.set_value(value)  # replaces the abstract ShapeDtypeStruct with the loaded array
    model.eos_token_ids = eos_token_ids(path)
    return model
