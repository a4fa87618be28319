"""SwiGLU MLP with gate and up merged in one projection: down(silu(x Wg) * (x Wu)).

Mirrors jax_impl/mlp.py. `gate_up_proj` is [H -> 2I] with the gate in the first I outputs; the loader
packs the checkpoint's gate_proj and up_proj in that order (spec/params.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from spec import ModelSpec
from torch_impl.activation import SiluAndMul
from torch_impl.tensor_parallel import column_linear, row_linear


class MLP(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        *,
        kernels: str = "reference",
        tp: int = 1,
        group: dist.ProcessGroup | None = None,
    ):
        """`spec` sizes this rank's features (ShardLayout.local_spec); tp > 1 makes down_proj row-parallel."""
        super().__init__()
        self.layer_idx = layer_idx
        self.gate_up_proj = column_linear(spec.hidden_size, 2 * spec.intermediate_size, False, tp, group)
        self.act_fn = SiluAndMul(kernels=kernels)
        self.down_proj = row_linear(spec.intermediate_size, spec.hidden_size, tp, group)

    def forward(self, x: torch.Tensor, trace: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [B, T, 2I]
        act = self.act_fn(gate_up)  # [B, T, I]
        if trace is not None:
            trace[f"layers.{self.layer_idx}.mlp.gate_up"] = gate_up
            trace[f"layers.{self.layer_idx}.mlp.act"] = act
        return self.down_proj(act)  # [B, T, H]
