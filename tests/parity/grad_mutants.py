"""Backward mutants: training bugs a port typically has, each injected into ONE framework for one test only.

Like tests/parity/mutants.py (the forward catalogue), every mutant is applied through a
`pytest.MonkeyPatch`, undone when the test ends, and nothing here is reachable from the product. A gradient
mutant must fail `check --grad` naming `expect`, the first gradient in backward order (head, final norm,
last layer ... first layer, embedding) that the bug changes; a step mutant must fail `check --steps` on a
parameter `expect` names (a substring), since its gradients are right and only the update is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax.numpy as jnp
import optax
import pytest
import torch
import torch.nn.functional as F

import jax_impl.optimizer
import jax_impl.training
import kernels.triton.reference as triton_ref
import torch_impl
import torch_impl.training
from tests.parity.mutant_patches import patch_loaded


@dataclass(frozen=True)
class GradMutant:
    name: str
    backend: str  # "torch" | "jax": where it is injected
    expect: str  # gradient mutants: the first failing gradient's name; step mutants: a substring of the parameter
    why: str
    inject: Callable[[pytest.MonkeyPatch], None]
    steps: int = 0  # > 0: a step mutant, checked with --steps

    @property
    def jax(self) -> bool:
        return self.backend == "jax"


def _embedding_gather_detached(mp: pytest.MonkeyPatch) -> None:
    """The tied table gets its gradient from the head only: the embedding lookup is cut from autograd."""

    def forward(self, input_ids):
        return F.embedding(input_ids, self.weight.detach())

    mp.setattr(torch_impl.embedding.Embedding, "forward", forward)


def _rms_as_constant(mp: pytest.MonkeyPatch) -> None:
    """RMSNorm's backward treats the RMS as a constant (rsqrt detached): the forward is unchanged."""

    def norm(x, residual, weight, eps):
        if residual is not None:
            x = (x.float() + residual.float()).to(x.dtype)
        xf = x.float()
        scale = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps).detach()
        out = weight * (xf * scale).to(x.dtype)
        return out if residual is None else (out, x)

    mp.setattr(triton_ref, "add_rms_norm_reference", norm)


class _SiluSigmoidGrad(torch.autograd.Function):
    """silu(x) forward, but sigmoid(x) as its derivative (the missing x * s * (1 - s) term)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.silu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.sigmoid(x)


def _silu_derivative_is_sigmoid(mp: pytest.MonkeyPatch) -> None:
    def act(x):
        gate, up = x.float().chunk(2, dim=-1)
        return (_SiluSigmoidGrad.apply(gate) * up).to(x.dtype)

    mp.setattr(triton_ref, "silu_and_mul_reference", act)


def _residual_detached_in_layer_1(mp: pytest.MonkeyPatch) -> None:
    """Layer 1 adds the residual stream without its gradient: nothing below it learns through the skip."""

    def change(model) -> None:
        norm = model.model.layers[1].input_layernorm
        original = norm.forward
        norm.forward = lambda x, residual=None: original(x, None if residual is None else residual.detach())

    patch_loaded(mp, torch_impl, change)


def _loss_over_all_positions(mp: pytest.MonkeyPatch) -> None:
    """The mean is taken over every position, the uncounted last one (and padding) included."""
    original = torch_impl.training.cross_entropy

    def loss(logits, labels, model=None):
        n, counted = labels.numel(), int((labels[:, 1:] != -100).sum())
        return original(logits, labels, model) * counted / n

    mp.setattr(torch_impl.training, "cross_entropy", loss)


def _decay_on_norms(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(jax_impl.optimizer, "decays", lambda kind: True)


def _adam_without_bias_correction(mp: pytest.MonkeyPatch) -> None:
    """Adam's moments used as they are: the first steps are 1 / sqrt(1 - b2) / (1 - b1) ~ 3x too large. The step
    count starts where b1 ** t and b2 ** t are 0, so both corrections divide by 1."""
    original = jax_impl.optimizer.torch_adamw

    def adamw(config, decay_mask):
        inner = original(config, decay_mask)

        def init(params):
            return inner.init(params)._replace(count=jnp.array(10**6, jnp.int32))

        return optax.GradientTransformation(init, inner.update)

    mp.setattr(jax_impl.optimizer, "torch_adamw", adamw)


GRAD_MUTANTS: list[GradMutant] = [
    GradMutant(
        "tied_grad_from_head_only", "torch", "model.embed_tokens.weight",
        "only the table's gather half is lost, and the table is the last gradient backward reaches",
        _embedding_gather_detached,
    ),
    GradMutant(
        "rmsnorm_backward_rms_constant", "torch", "model.layers.1.mlp.down_proj.weight",
        "the final norm's weight gradient does not pass through its own input gradient; the first tensor "
        "below that input is the last layer's down_proj",
        _rms_as_constant,
    ),
    GradMutant(
        "silu_derivative_is_sigmoid", "torch", "model.layers.1.mlp.gate_proj.weight",
        "down_proj and up_proj see the right activation; gate_proj is the first behind silu's derivative",
        _silu_derivative_is_sigmoid,
    ),
    GradMutant(
        "residual_add_detached_in_layer_1", "torch", "model.layers.0.self_attn.o_proj.weight",
        "layer 1 and layer 0's MLP still get the gradient of x2 (the MLP's increment is added, not cut); x1 "
        "loses the skip path's share, and o_proj is the first weight behind x1",
        _residual_detached_in_layer_1,
    ),
    GradMutant(
        "loss_mean_over_all_positions", "torch", "loss",
        "the loss value itself is scaled by counted / all positions",
        _loss_over_all_positions,
    ),
    GradMutant(
        "weight_decay_on_norm_weights", "jax", "norm",
        "gradients are right; the update of every norm weight gains lr * wd * w",
        _decay_on_norms, steps=2,
    ),
    GradMutant(
        "adam_bias_correction_missing", "jax", "model.",
        "gradients are right; every update is too large in the first steps",
        _adam_without_bias_correction, steps=2,
    ),
]  # fmt: skip
