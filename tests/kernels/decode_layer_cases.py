"""The cases both backends' layer-call tests run (tests/kernels/test_cpu_decode_layer.py for torch,
test_jax_decode_layer.py for JAX): the model shapes, the padded prompt batch and the number of steps, and the
CAN_BUILD skip."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kernels.cpu import build
from spec import DEFAULT_SPEC, ModelSpec, write_checkpoint
from spec.default import random_weights
from tests.specs import QWEN2_SINGLE_KV

CAN_BUILD = build._unsupported() is None  # x86-64 with AVX2 and FMA, and a C compiler: every CI machine
needs_kernels = pytest.mark.skipif(
    not CAN_BUILD, reason=f"the CPU kernels cannot be built here: {build._unsupported()}"
)

ODD = dataclasses.replace(  # widths that are not multiples of 8, three query heads per kv head
    DEFAULT_SPEC, hidden_size=76, intermediate_size=100, num_attention_heads=6, num_key_value_heads=2, head_dim=20
)
SPECS = {"qwen3": DEFAULT_SPEC, "qwen3-odd": ODD, "qwen2-bias": QWEN2_SINGLE_KV}
PROMPT = [[5, 9, 200, 17, 3], [0, 0, 4, 1, 8], [7, 7, 7, 7, 7]]  # row 1 left-padded (attention_mask)
MASK = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
STEPS = 6


def write(tmp_path, spec: ModelSpec) -> None:
    """The checkpoint every layer-call test loads: `spec` with seeded random weights."""
    write_checkpoint(tmp_path, spec, random_weights(spec, seed=3))
