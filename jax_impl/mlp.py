"""The decoder's MLP: gated, down(act(x Wg) * (x Wu)) with gate and up merged in one projection (SwiGLU, GeGLU),
or plain, down(act(x Wu)) (GPT-NeoX), with biases where the spec says so.

Mirrors torch_impl/mlp.py. `gate_up_proj` is [H -> 2I] with the gate in the first I outputs (Flax keeps
the kernel as [H, 2I]); the loader packs the checkpoint's gate_proj and up_proj in that order. down_proj's bias
is added once, after the product: under tensor parallelism the partitioner sums the partial products first.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl.activation import GATED, activation
from jax_impl.linear import Linear
from spec import ModelSpec

HIGHEST = jax.lax.Precision.HIGHEST


class MLP(nnx.Module):
    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        *,
        dtype: jnp.dtype,
        kernels: str = "reference",
        tp: int = 1,
        rngs: nnx.Rngs,
    ):
        self.layer_idx = layer_idx
        self.tp = tp  # > 1: gate_up columns are grouped per shard as [gate_r | up_r] (spec/parallel.py)
        self.gated = spec.gated_mlp
        self.hidden_act = spec.hidden_act
        kw = dict(use_bias=spec.mlp_bias, dtype=dtype, param_dtype=dtype, precision=HIGHEST, rngs=rngs)
        if self.gated:
            self.gate_up_proj = Linear(spec.hidden_size, 2 * spec.intermediate_size, **kw)
            self.act_fn = GATED[spec.hidden_act](kernels=kernels)
        else:
            self.up_proj = Linear(spec.hidden_size, spec.intermediate_size, **kw)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, **kw)

    def __call__(self, x: jax.Array, trace: dict[str, jax.Array] | None = None) -> jax.Array:
        name = f"layers.{self.layer_idx}.mlp"
        if not self.gated:
            up = self.up_proj(x)  # [B, T, I]
            act = activation(self.hidden_act, up)
            if trace is not None:
                trace[f"{name}.up"] = up
                trace[f"{name}.act"] = act
            return self.down_proj(act)  # [B, T, H]
        gate_up = self.gate_up_proj(x)  # [B, T, 2I]
        if self.tp > 1:  # split gate from up inside each shard's block: no data crosses devices
            lead = gate_up.shape[:-1]  # [B, T], or [N] in a shared expert (jax_impl/moe.py)
            act = self.act_fn(gate_up.reshape(*lead, self.tp, -1)).reshape(*lead, -1)  # [..., s, 2I/s] -> [..., I]
        else:
            act = self.act_fn(gate_up)  # [B, T, I]
        if trace is not None:
            trace[f"{name}.gate_up"] = gate_up
            trace[f"{name}.act"] = act
        return self.down_proj(act)  # [B, T, H]
