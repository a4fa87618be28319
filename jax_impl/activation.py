"""SwiGLU's activation: silu(gate) * up on a merged [..., 2I] input, gate first.

Mirrors torch_impl/activation.py. The math lives in kernels/pallas/reference.py (fp32, cast once);
`kernels="fused"` runs the Pallas kernel with the same contract.
"""

from __future__ import annotations

import jax
from flax import nnx

from kernels.pallas import reference


class SiluAndMul(nnx.Module):
    def __init__(self, *, kernels: str = "reference"):
        self.kernels = kernels

    def __call__(self, gate_up: jax.Array) -> jax.Array:
        if self.kernels == "fused":
            from kernels.pallas import silu_and_mul  # imports pallas: only on the fused path

            return silu_and_mul(gate_up)
        return reference.silu_and_mul_reference(gate_up)  # [..., 2I] -> [..., I]
