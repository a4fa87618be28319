"""jax_impl's sparse block (jax_impl/moe.py) against answers worked out by hand, in every dispatch form (dense,
ragged, tiled, gather): routing, renormalization, the shared expert's sigmoid gate, and the routing weights' dtype
(Mixtral float32, Qwen rounded). Mirrors tests/torch_impl/test_moe_block.py; the whole models against transformers
are in tests/jax_impl/test_moe.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import spec

# -- known answers: 2 tokens, 3 experts, top-2, worked out by hand --------------------------------------------------
# Router rows (torch layout [E, H]) [[ln 3, 0], [ln 2, ln 2], [0, ln 5]] on x0 = [1, 0], x1 = [0, 1]:
#   x0: logits [ln 3, ln 2, 0] -> probs [1/2, 1/3, 1/6] -> top-2 ids [0, 1], weights [1/2, 1/3] (renormalized 3/5, 2/5)
#   x1: logits [0, ln 2, ln 5] -> probs [1/8, 2/8, 5/8] -> top-2 ids [2, 1], weights [5/8, 1/4] (renormalized 5/7, 2/7)
# Shared gate row [0, ln 3]: sigmoid(0) = 1/2 on x0, sigmoid(ln 3) = 3/4 on x1.
ROUTER = np.log(np.array([[3.0, 1.0], [2.0, 2.0], [1.0, 5.0]]))
X = np.array([[1.0, 0.0], [0.0, 1.0]])
WANT = {
    True: (np.array([[0, 1], [2, 1]]), np.array([[3 / 5, 2 / 5], [5 / 7, 2 / 7]])),
    False: (np.array([[0, 1], [2, 1]]), np.array([[1 / 2, 1 / 3], [5 / 8, 1 / 4]])),
}


def small_block(model_type: str, norm: bool, shared: bool, dtype=None):
    """A SparseMoeBlock of H = 2, E = 3, k = 2, Im = 1 with the router above and random experts; returns the block
    and a float64 numpy reference of each expert (silu(x g) * (x u)) d and of the shared expert."""
    import dataclasses

    import jax.numpy as jnp
    from flax import nnx

    from jax_impl.moe import SparseMoeBlock

    dtype = dtype or jnp.float32
    extra = dict(shared_expert_intermediate_size=1) if shared else {}
    s = dataclasses.replace(
        spec.DEFAULT_SPEC, model_type=model_type, hidden_size=2, num_experts=3, num_experts_per_tok=2,
        moe_intermediate_size=1, norm_topk_prob=norm, router_weights_float32=model_type == "mixtral", **extra,
    )  # fmt: skip
    block = SparseMoeBlock(s, 0, dtype=dtype, rngs=nnx.Rngs(0))
    block.router.kernel.set_value(jnp.asarray(ROUTER.T, dtype))
    rng = np.random.default_rng(1)
    gate_up, down = rng.standard_normal((3, 2, 2)), rng.standard_normal((3, 1, 2))  # Flax [E, in, out]
    block.experts.gate_up_proj.kernel.set_value(jnp.asarray(gate_up, dtype))
    block.experts.down_proj.kernel.set_value(jnp.asarray(down, dtype))

    def silu(v):
        return v / (1 + np.exp(-v))

    def expert(e, x):
        h = x @ gate_up[e]
        return (silu(h[..., :1]) * h[..., 1:]) @ down[e]

    shared_fn = None
    if shared:
        sg, sd = rng.standard_normal((2, 2)), rng.standard_normal((1, 2))
        block.shared_expert.gate_up_proj.kernel.set_value(jnp.asarray(sg, dtype))
        block.shared_expert.down_proj.kernel.set_value(jnp.asarray(sd, dtype))
        block.shared_expert_gate.kernel.set_value(jnp.asarray([[0.0], [np.log(3.0)]], dtype))

        def shared_fn(x):
            h = x @ sg
            return (silu(h[..., :1]) * h[..., 1:]) @ sd

    return block, expert, shared_fn


@pytest.mark.parametrize(("model_type", "norm", "shared"), [("qwen3_moe", True, False), ("qwen2_moe", False, True)])
def test_known_answer_block(model_type, norm, shared):
    import jax.numpy as jnp

    block, expert, shared_fn = small_block(model_type, norm, shared)
    want_ids, want_w = WANT[norm]
    for form in ("dense", "ragged", "tiled", "gather"):
        block.dispatch = form
        trace: dict = {}
        out = np.asarray(block(jnp.asarray(X[None], jnp.float32), trace))[0]  # [2, H]
        np.testing.assert_array_equal(np.asarray(trace["layers.0.moe.topk_ids"])[0], want_ids)
        np.testing.assert_allclose(np.asarray(trace["layers.0.moe.topk_weights"])[0], want_w, rtol=1e-6)
        experts = np.stack([sum(want_w[n, j] * expert(want_ids[n, j], X[n]) for j in range(2)) for n in range(2)])
        np.testing.assert_allclose(np.asarray(trace["layers.0.moe.experts_out"])[0], experts, rtol=1e-5, atol=1e-6)
        want = experts
        if shared:  # sigmoid gates 1/2 and 3/4
            gated = np.array([[0.5], [0.75]]) * np.stack([shared_fn(x) for x in X])
            np.testing.assert_allclose(np.asarray(trace["layers.0.moe.shared_out"])[0], gated, rtol=1e-5, atol=1e-6)
            want = experts + gated
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_routing_weights_dtype_mixtral_float32_qwen_rounded():
    """bfloat16 activations: Mixtral keeps its routing weights float32, Qwen rounds them to bfloat16 first."""
    import jax.numpy as jnp

    for model_type, want in (("mixtral", jnp.float32), ("qwen3_moe", jnp.bfloat16)):
        block, *_ = small_block(model_type, True, False, dtype=jnp.bfloat16)
        trace: dict = {}
        block(jnp.asarray(X[None], jnp.bfloat16), trace)
        assert trace["layers.0.moe.topk_weights"].dtype == want, model_type
        assert trace["layers.0.moe.router_logits"].dtype == jnp.bfloat16  # the activation dtype, as F.linear
