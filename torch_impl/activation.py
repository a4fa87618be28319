"""The MLP activations: gated on a merged [..., 2I] input, gate first (SwiGLU's silu, GeGLU's tanh GELU), and
the plain activation of a non-gated MLP (GPT-NeoX).

Mirrors jax_impl/activation.py. The gated math lives in kernels/triton/reference.py (fp32, cast once);
`kernels="fused"` runs the Triton kernel with the same contract; CPU generation's rows (its prompt's and decode
steps') run SwiGLU's math in one C call (kernels/cpu/torch_decode_ops.py). `activation(name, x)` computes in float32
and casts once, as torch's own GELU/SiLU do on a low-precision input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu import torch_decode_ops
from kernels.triton import reference


class SiluAndMul(nn.Module):
    def __init__(self, *, kernels: str = "reference"):
        super().__init__()
        self.kernels = kernels

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.kernels == "fused":
            from kernels.triton import silu_and_mul  # imports triton: only on the fused path

            return silu_and_mul(gate_up)
        if torch_decode_ops.takes(gate_up):  # generation's rows: the reference's math in one call
            return torch_decode_ops.silu_and_mul(gate_up)
        return reference.silu_and_mul_reference(gate_up)  # [..., 2I] -> [..., I]


class GeluTanhAndMul(nn.Module):
    """GeGLU (Gemma): gelu_tanh(gate) * up, float32 math rounded once."""

    def __init__(self, *, kernels: str = "reference"):
        super().__init__()
        self.kernels = kernels

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.kernels == "fused":
            try:
                from kernels.triton import gelu_tanh_and_mul  # imports triton: only on the fused path
            except ImportError as err:  # the kernel is a later addition to kernels/triton
                raise NotImplementedError(
                    "kernels='fused': kernels.triton has no gelu_tanh_and_mul kernel (GeGLU) yet; "
                    "use kernels='reference'"
                ) from err
            return gelu_tanh_and_mul(gate_up)
        return reference.gelu_tanh_and_mul_reference(gate_up)  # [..., 2I] -> [..., I]


class GeluAndMul(nn.Module):
    """Gated exact-erf GELU (a Gemma config's hidden_activation "gelu"): no kernel, the reference math on both
    paths."""

    def __init__(self, *, kernels: str = "reference"):
        super().__init__()
        self.kernels = kernels

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        reference.check_silu_and_mul_args(gate_up, op="gelu_and_mul")
        gate, up = gate_up.float().chunk(2, dim=-1)  # [..., I] each
        return (F.gelu(gate) * up).to(gate_up.dtype)


GATED = {"silu": SiluAndMul, "gelu_tanh": GeluTanhAndMul, "gelu": GeluAndMul}


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """The non-gated MLP's activation `name` ("silu" | "gelu_tanh" | "gelu": exact erf) of x, float32, cast once."""
    xf = x.float()
    if name == "silu":
        out = F.silu(xf)
    elif name == "gelu_tanh":
        out = F.gelu(xf, approximate="tanh")
    elif name == "gelu":
        out = F.gelu(xf)
    else:
        raise AssertionError(f"activation {name!r}: spec.ModelSpec admits no such hidden_act")
    return out.to(x.dtype)
