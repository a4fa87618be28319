"""The gate activations of the gated MLP kernels (swiglu.py, swiglu_backward.py), and their shared tiling.
Twin of kernels/triton/activations.py (which derives the form): act(x) = x * sigmoid(z(x)) with z = x (silu) or
z = 2 sqrt(2/pi) (x + 0.044715 x^3) (gelu_tanh: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), without the cancellation
of 1 + tanh(u) for u << 0). Plain jnp on float32 blocks, traced into the Pallas kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

__all__ = ["ACTIVATIONS", "gate_logit", "gate_logit_slope", "gated_block_config"]

# activation -> the op's public name (error messages, kernel names)
ACTIVATIONS = {"silu": "silu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}

_TWO_BETA = 1.5957691216057308  # 2 * sqrt(2 / pi): z = 2u
_KAPPA = 0.044715
_MAX_BLOCK_COLS = 1024


def gate_logit(gate: jax.Array, activation: str) -> jax.Array:
    """z(gate), float32: act(gate) = gate * sigmoid(z)."""
    if activation == "silu":
        return gate
    return jnp.float32(_TWO_BETA) * (gate + jnp.float32(_KAPPA) * gate * gate * gate)


def gate_logit_slope(gate: jax.Array) -> jax.Array:
    """dz/dgate for the non-silu activations (silu's is 1, which the kernels never multiply by)."""
    return jnp.float32(_TWO_BETA) * (1.0 + jnp.float32(3.0 * _KAPPA) * gate * gate)


def gated_block_config(n_inter: int, *, op: str, elements_per_program: int, elements_per_warp: int) -> dict[str, int]:
    """The Triton twin's tiling (see there), with Pallas' power-of-two helper."""
    if n_inter < 1:
        raise ValueError(f"{op}: width I must be >= 1, got {n_inter}")
    block_cols = min(pl.next_power_of_2(n_inter), _MAX_BLOCK_COLS)
    block_rows = max(1, elements_per_program // block_cols)
    num_warps = min(max(block_rows * block_cols // elements_per_warp, 1), 8)
    return {"BLOCK_ROWS": block_rows, "BLOCK_COLS": block_cols, "num_warps": num_warps}
