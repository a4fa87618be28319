"""torch_impl's sparse block (torch_impl/moe.py) against answers worked out by hand: routing, renormalization, the
shared expert's sigmoid gate, and the routing weights' dtype (Mixtral float32, Qwen rounded). Mirrors
tests/jax_impl/test_moe_block.py; the whole models against transformers are in tests/torch_impl/test_moe.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from spec import ModelSpec
from torch_impl.moe import SparseMoeBlock


def block_spec(norm_topk_prob: bool, shared: bool = False, mixtral: bool = False) -> ModelSpec:
    """One layer, H = 2, 3 experts of width 1, top-2 (Mixtral: router weights kept float32)."""
    return ModelSpec(
        model_type="mixtral" if mixtral else "qwen2_moe",
        vocab_size=8,
        hidden_size=2,
        intermediate_size=4,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=2,
        rms_norm_eps=1e-6,
        rope_theta=1e4,
        rope_scaling=None,
        max_position_embeddings=16,
        tie_word_embeddings=False,
        attention_bias=not mixtral,
        qk_norm=False,
        num_experts=3,
        num_experts_per_tok=2,
        moe_intermediate_size=1,
        norm_topk_prob=norm_topk_prob or mixtral,
        router_weights_float32=mixtral,
        shared_expert_intermediate_size=1 if shared else 0,
    )


def silu(z: float) -> float:
    return z / (1 + math.exp(-z))


# Router rows: token 0 = [1, 0] has logits (ln 1, ln 2, ln 5): probs 1/8, 2/8, 5/8 -> experts 2, 1; token 1 =
# [0, 1] has logits (ln 4, ln 3, ln 1): probs 4/8, 3/8, 1/8 -> experts 0, 1.
ROUTER = [[0.0, math.log(4)], [math.log(2), math.log(3)], [math.log(5), 0.0]]
GATE_UP = [[[1.0, 2.0], [3.0, -1.0]], [[-1.0, 0.5], [2.0, 2.0]], [[0.5, 1.0], [1.0, 4.0]]]  # [E, 2 (gate, up), H]
DOWN = [[[1.0], [-2.0]], [[3.0], [1.0]], [[-1.0], [0.5]]]  # [E, H, 1]


def expert(e: int, x: list[float]) -> np.ndarray:
    """down_e(silu(gate_e . x) * (up_e . x)), by hand."""
    g = GATE_UP[e][0][0] * x[0] + GATE_UP[e][0][1] * x[1]
    u = GATE_UP[e][1][0] * x[0] + GATE_UP[e][1][1] * x[1]
    return np.array([DOWN[e][0][0], DOWN[e][1][0]]) * silu(g) * u


def known_block(spec: ModelSpec, dtype: torch.dtype = torch.float32) -> SparseMoeBlock:
    block = SparseMoeBlock(spec, 0)
    with torch.no_grad():
        block.router.weight.copy_(torch.tensor(ROUTER))
        block.experts.gate_up_proj.weight.copy_(torch.tensor(GATE_UP))
        block.experts.down_proj.weight.copy_(torch.tensor(DOWN))
        if spec.shared_expert_intermediate_size:
            block.shared_expert.gate_up_proj.weight.copy_(torch.tensor([[1.0, 1.0], [2.0, -1.0]]))
            block.shared_expert.down_proj.weight.copy_(torch.tensor([[1.0], [2.0]]))
            block.shared_expert_gate.weight.copy_(torch.tensor([[math.log(3), 0.0]]))  # sigmoid: 3/4 and 1/2
    return block.to(dtype)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("shared", [False, True])
def test_known_answer_block(norm, shared):
    x = [[1.0, 0.0], [0.0, 1.0]]
    trace: dict[str, torch.Tensor] = {}
    out = known_block(block_spec(norm, shared))(torch.tensor([x]), trace)[0].detach().numpy()
    ids, weights = [[2, 1], [0, 1]], [[5 / 8, 2 / 8], [4 / 8, 3 / 8]]
    if norm:
        weights = [[5 / 7, 2 / 7], [4 / 7, 3 / 7]]
    want = np.array([sum(w * expert(e, x[n]) for e, w in zip(ids[n], weights[n], strict=True)) for n in range(2)])
    np.testing.assert_array_equal(trace["layers.0.moe.topk_ids"][0].numpy(), ids)
    np.testing.assert_allclose(trace["layers.0.moe.topk_weights"][0].detach().numpy(), weights, rtol=1e-6)
    np.testing.assert_allclose(trace["layers.0.moe.experts_out"][0].detach().numpy(), want, rtol=1e-6)
    if shared:  # gate_up rows (1, 1), (2, -1); down (1, 2); sigmoid gate 3/4 for token 0, 1/2 for token 1
        shared_out = np.array(
            [
                g * silu(x[n][0] + x[n][1]) * (2 * x[n][0] - x[n][1]) * np.array([1.0, 2.0])
                for n, g in enumerate((3 / 4, 1 / 2))
            ]
        )
        np.testing.assert_allclose(trace["layers.0.moe.shared_out"][0].detach().numpy(), shared_out, rtol=1e-6)
        want = want + shared_out
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_mixtral_weights_stay_float32_and_qwen_weights_are_rounded():
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.bfloat16)
    # 5/7 is not a bfloat16 value: kept float32 it stays 5/7 up to the bf16 router logits' rounding (~1e-3 of
    # ln 5: the weight moves by < 2e-3); rounded to bfloat16 it is 0.71484375 whatever the logits
    for mixtral, dtype in ((True, torch.float32), (False, torch.bfloat16)):
        trace: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            known_block(block_spec(True, mixtral=mixtral), torch.bfloat16)(x, trace)
        weights = trace["layers.0.moe.topk_weights"]
        assert weights.dtype == dtype
        assert trace["layers.0.moe.router_logits"].dtype == torch.bfloat16  # computed in the activation dtype
        w = float(weights[0, 0, 0])
        assert w == float(torch.tensor(w).bfloat16()) if not mixtral else w != float(torch.tensor(w).bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mixtral", [False, True])
def test_one_token_path_is_bit_identical_to_the_grouped_path(dtype, mixtral):
    """A batch-1 decode step takes Experts._one_token; its output must equal _grouped's bit for bit (each expert
    gets one row either way, summed in expert order), the routing weights float32 (Mixtral) or rounded (Qwen)."""
    spec = dataclasses.replace(block_spec(True, mixtral=mixtral), hidden_size=24, num_experts=7, num_experts_per_tok=3)
    spec = dataclasses.replace(spec, moe_intermediate_size=5)
    block = SparseMoeBlock(spec, 0).to(dtype)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
        for seed in range(8):
            x = torch.randn(1, 24, generator=torch.Generator().manual_seed(seed)).to(dtype)
            _, ids, weights = block.route(x)
            one = block.experts._one_token(x, ids, weights)
            assert torch.equal(one, block.experts._grouped(x, ids, weights)), seed
            assert torch.equal(block.experts(x, ids, weights), one)
