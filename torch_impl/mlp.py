"""The MLP: gated, down(act(x Wg) * (x Wu)) with gate and up merged in one projection (SwiGLU, GeGLU), or plain,
down(act(x Wu)) (GPT-NeoX), with biases where the spec says so.

Mirrors jax_impl/mlp.py. `gate_up_proj` is [H -> 2I] with the gate in the first I outputs; the loader
packs the checkpoint's gate_proj and up_proj in that order (spec/params.py). A down_proj bias is added once,
after the row-parallel sum (torch_impl/tensor_parallel.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from spec import ModelSpec
from torch_impl.activation import GATED, activation
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
        intermediate_size: int | None = None,
    ):
        """`spec` sizes this rank's features (ShardLayout.local_spec); tp > 1 makes down_proj row-parallel.
        `intermediate_size`: this rank's width when it is not the spec's (Qwen2-MoE's shared expert, moe.py)."""
        super().__init__()
        self.layer_idx = layer_idx
        self.gated, self.hidden_act = spec.gated_mlp, spec.hidden_act
        h = spec.hidden_size
        i = spec.intermediate_size if intermediate_size is None else intermediate_size
        if self.gated:
            self.gate_up_proj = column_linear(h, 2 * i, spec.mlp_bias, tp, group)
            self.act_fn = GATED[spec.hidden_act](kernels=kernels)
        else:
            self.up_proj = column_linear(h, i, spec.mlp_bias, tp, group)
        self.down_proj = row_linear(i, h, tp, group, spec.mlp_bias)

    def forward(self, x: torch.Tensor, trace: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        name = f"layers.{self.layer_idx}.mlp"
        if self.gated:
            gate_up = self.gate_up_proj(x)  # [B, T, 2I]
            act = self.act_fn(gate_up)  # [B, T, I]
            if trace is not None:
                trace[f"{name}.gate_up"] = gate_up
        else:
            up = self.up_proj(x)  # [B, T, I]
            act = activation(self.hidden_act, up)
            if trace is not None:
                trace[f"{name}.up"] = up
        if trace is not None:
            trace[f"{name}.act"] = act
        return self.down_proj(act)  # [B, T, H]
