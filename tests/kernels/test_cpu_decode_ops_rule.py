"""When torch_impl's layers take the CPU operators (kernels/cpu/torch_decode_ops.py's rule): generation's decode steps
and prompt only, nobody watching, nothing to differentiate; and a whole generation through them against the same
generation kept on the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

import spec
import torch_impl
import torch_impl.layernorm
from kernels.cpu import build, torch_decode_ops
from tests.greedy import assert_same_greedy

CAN_BUILD = build._unsupported() is None  # x86-64 with AVX2 and FMA, and a C compiler: every CI machine
pytestmark = pytest.mark.skipif(not CAN_BUILD, reason=f"the CPU kernels cannot be built here: {build._unsupported()}")


class Watching(TorchFunctionMode):
    """A function mode that only passes calls through (a tracer or logger would see each operator)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_the_rule_takes_generations_decode_steps_only():
    """Inside generate's `decode_steps()` only: one token per row, at most MAX_ROWS rows, CPU float32/bfloat16,
    nothing to differentiate, nobody watching; `takes_step` the same."""
    step = torch.zeros(2, 1, 64)
    with torch.inference_mode():
        assert not torch_decode_ops.takes(step)  # a one-token forward outside generation: a parity trace, a mutant
        assert not torch_decode_ops.takes_step(step)
        with torch_decode_ops.decode_steps():
            assert torch_decode_ops.takes(step) and torch_decode_ops.takes_step(step)
            assert not torch_decode_ops.takes(torch.zeros(2, 3, 64))  # several tokens a row
            assert not torch_decode_ops.takes(torch.zeros(torch_decode_ops.MAX_ROWS + 1, 1, 64))
            assert not torch_decode_ops.takes(step.half())
            assert not torch_decode_ops.takes(torch.zeros(2, 64))  # not [B, T, ...]
            with torch_decode_ops.reference_only():
                assert not torch_decode_ops.takes(step)
            with FlopCounterMode(display=False):  # a dispatch mode sees the reference's operators
                assert not torch_decode_ops.takes(step)
            with Watching():  # so does a function mode
                assert not torch_decode_ops.takes(step)
    weight, residual = torch.nn.Parameter(torch.ones(64)), torch.zeros(2, 1, 64, requires_grad=True)
    with torch_decode_ops.decode_steps():
        assert not torch_decode_ops.takes(step, weight)  # autograd would record the weight's gradient
        assert not torch_decode_ops.takes(step, torch.ones(64), residual)  # or the residual's
        with torch.no_grad():
            assert torch_decode_ops.takes(step, weight, residual)


def test_a_norm_that_needs_a_gradient_keeps_autograd():
    """A residual that requires a gradient inside decode steps: the reference runs and records it."""
    norm = torch_impl.layernorm.RMSNorm(8, 1e-6)
    norm.weight.requires_grad_(False)
    residual = torch.randn(1, 1, 8, requires_grad=True)
    with torch_decode_ops.decode_steps():
        out, new = norm(torch.randn(1, 1, 8), residual)
    assert out.grad_fn is not None and new.grad_fn is not None


def test_a_prompt_takes_the_operators_but_not_the_one_call_layer():
    """Inside `prompts()`: any number of token rows and batch rows take the row operators (`takes`) and the attention;
    the one-call layer (`takes_step`) stays a decode step's, and the other conditions hold as in decode steps."""
    prompt, step = torch.zeros(3, 17, 64), torch.zeros(2, 1, 64)
    k, v = torch.zeros(3, 2, 17, 8), torch.zeros(3, 2, 8, 17)
    with torch.inference_mode():
        assert not torch_decode_ops.takes(prompt)
        with torch_decode_ops.prompts():
            assert torch_decode_ops.takes(prompt) and torch_decode_ops.takes(step)
            assert torch_decode_ops.takes(torch.zeros(torch_decode_ops.MAX_ROWS + 1, 5, 64))  # any batch
            assert not torch_decode_ops.takes_step(prompt) and not torch_decode_ops.takes_step(step)
            assert torch_decode_ops.takes_attention(torch.zeros(3, 17, 2, 2, 8), k, v)
            assert not torch_decode_ops.takes_attention(torch.zeros(3, 17, 2, 2, 8), k.bfloat16(), v)
            assert not torch_decode_ops.takes(prompt.half())
            with torch_decode_ops.reference_only():
                assert not torch_decode_ops.takes(prompt)
            with FlopCounterMode(display=False):
                assert not torch_decode_ops.takes(prompt)
    with torch_decode_ops.prompts():
        assert not torch_decode_ops.takes(prompt, torch.nn.Parameter(torch.ones(64)))  # a gradient to record


def test_generation_through_the_kernels_equals_the_reference(tmp_path):
    """The default checkpoint decoded greedily, float32: the same tokens (up to a near-tie, tests/greedy.py), and
    every step's logits, the prompt's included, within the float32 parity bound of the generation kept on the
    reference (the kernels run at the prompt and every decode step: counted)."""
    from parity.tolerances import TOLERANCES

    model = torch_impl.from_pretrained(spec.default_checkpoint(tmp_path))
    prompt = [[5, 9, 200, 17], [3, 1, 4, 1]]
    calls = {"attend": 0, "attend_rows": 0, "silu_and_mul": 0, "norm_rotary": 0}
    table = torch_decode_ops._functions()
    launches = {op: table[op, torch.float32] for op in calls}

    def counted(op):
        def call(*args):
            calls[op] += 1
            return launches[op](*args)

        return call

    table.update({(op, torch.float32): counted(op) for op in calls})
    try:
        fast = torch_impl.generate(model, prompt, 8, eos_token_ids=(), return_logits=True)
    finally:
        table.update({(op, torch.float32): launch for op, launch in launches.items()})
    with torch_decode_ops.reference_only():
        ref = torch_impl.generate(model, prompt, 8, eos_token_ids=(), return_logits=True)
    layers = model.spec.num_hidden_layers
    assert calls["attend"] == 7 * layers * len(prompt)  # 7 decode steps, every layer, each row
    assert calls["attend_rows"] == layers * len(prompt)  # the prompt's steps: attend.c's blocked kernel
    assert calls["silu_and_mul"] == 8 * layers  # one call for the prompt's or a step's rows
    assert model.spec.qk_norm and calls["norm_rotary"] == 8 * layers  # the q/k norms and RoPE: one call
    # the suite's rule for greedy runs of two correct float32 paths: identical tokens, except from a near-tie on
    assert_same_greedy({"reference": ref.tokens, "kernels": fast.tokens}, ref.logits)
    differs = np.flatnonzero((np.array(ref.tokens) != np.array(fast.tokens)).any(axis=0))  # steps where a row split
    agree = int(differs[0]) if differs.size else len(ref.logits)  # the steps fed the same tokens
    bound = TOLERANCES["float32"].max_rel
    for step, (a, b) in enumerate(zip(fast.logits[:agree], ref.logits[:agree], strict=True)):  # the same inputs
        assert np.abs(a - b).max() <= bound * np.abs(b).max(), step
