"""A decode step's layers in one call (torch_decode_stack.LayerStack, run by torch_impl's Model) and the prepared
per-layer calls it is made of (LayerCall): a weight replaced, reassigned or written between steps is read at the
next step as the per-operator layer reads it; a finished generation's cache is freed; a full cache is refused as
cache.update refuses it; a stack whose tensors were freed, or made of calls that never ran, refuses to run; a layer
with a forward hook on it or inside it runs its forward, hooks and all.
(tests/kernels/test_cpu_decode_layer.py holds the stacked steps to the per-operator ones bit for bit.)
"""

from __future__ import annotations

import copy
import gc
import io
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import torch_impl
from kernels.cpu import torch_decode_layer, torch_decode_ops, torch_decode_stack
from spec import DEFAULT_SPEC, InputError
from tests.kernels.decode_layer_cases import MASK, PROMPT, SPECS, STEPS, needs_kernels, write
from torch_impl import linear
from torch_impl.kv_cache import KVCache

pytestmark = needs_kernels


def load(tmp_path, shape: str = "qwen3"):
    write(tmp_path, SPECS[shape])
    return torch_impl.from_pretrained(tmp_path, "float32")


def generate(model, stream=None):
    with linear.PATHS.forced("gemv"):  # a test model's weights would keep F.linear unmeasured
        return torch_impl.generate(
            model, PROMPT, STEPS, attention_mask=MASK, eos_token_ids=(), return_logits=True, stream=stream
        )


def replace_parameter(model):
    down = model.model.layers[1].mlp.down_proj
    down.weight = nn.Parameter(down.weight.detach() * 2)


def reassign_data(model):
    down = model.model.layers[1].mlp.down_proj
    down.weight.data = down.weight.detach() * 2


def restride_data(model):
    """The same memory, shape and address read with other strides (column by column): only the strides tell it."""
    down = model.model.layers[1].mlp.down_proj
    down.weight.data = down.weight.detach().as_strided(down.weight.shape, (1, down.weight.shape[0]))


def write_in_place(model):
    model.model.layers[1].mlp.down_proj.weight.mul_(2)


def write_a_bias(model):
    model.model.layers[0].self_attn.q_proj.bias.add_(0.5)


CHANGES = {
    "parameter replaced": ("qwen3", replace_parameter),
    "data reassigned": ("qwen3", reassign_data),
    "data restrided": ("qwen3", restride_data),
    "written in place": ("qwen3", write_in_place),
    "bias written in place": ("qwen2-bias", write_a_bias),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_weight_changed_between_steps_is_read_at_the_next_step(tmp_path, change):
    """The change lands after the second token, when every layer's call is laid out and the steps are stacked; the
    stacked generation then agrees bit for bit with the per-operator one given the same change, and both differ
    from a generation without it (the change reached the logits)."""
    shape, apply = CHANGES[change]

    def run(per_operator: bool, changed: bool):
        model = load(tmp_path / f"{per_operator}{changed}", shape)

        def stream(step, _tokens):
            if changed and step == 2:
                with torch.no_grad():
                    apply(model)

        if per_operator:
            with torch_decode_layer.per_operator():
                return generate(model, stream)
        return generate(model, stream)

    stacked, per, unchanged = run(False, True), run(True, True), run(False, False)
    for step, (a, b) in enumerate(zip(stacked.logits, per.logits, strict=True)):
        assert np.array_equal(a, b), step
    assert np.array_equal(stacked.logits[2], unchanged.logits[2])  # the change comes after step 2's scores
    assert not np.array_equal(stacked.logits[3], unchanged.logits[3])


def step(model, cache, token: int):
    rows = cache.length + 1
    with torch.inference_mode(), linear.PATHS.forced("gemv"), torch_decode_ops.decode_steps():
        return model([[token]], cache=cache, attention_mask=torch.ones(1, rows, dtype=torch.long))


def test_a_full_cache_is_refused_on_a_stacked_step(tmp_path):
    model = load(tmp_path)
    cache = KVCache.create(model.module_spec, 1, 4, torch.float32)
    with torch.inference_mode(), linear.PATHS.forced("gemv"), torch_decode_ops.decode_steps():
        model([[1, 2]], cache=cache)
    step(model, cache, 3)  # lays every layer's call out
    step(model, cache, 4)  # stacked: the cache is now full
    assert model.model._stack is not None
    with pytest.raises(InputError, match="KV cache is full: 5 positions requested, capacity 4"):
        step(model, cache, 5)


def test_a_finished_generation_frees_its_cache_and_its_stack_refuses_to_run(tmp_path):
    model = load(tmp_path)
    cache = KVCache.create(model.module_spec, 1, 8, torch.float32)
    with torch.inference_mode(), linear.PATHS.forced("gemv"), torch_decode_ops.decode_steps():
        model([[1, 2]], cache=cache)
    for token in (3, 4, 5):
        step(model, cache, token)
    stack, keys = model.model._stack, weakref.ref(cache.k[0])
    assert stack is not None
    del cache
    gc.collect()
    assert keys() is None  # neither the layers' calls nor the stack kept the cache
    x = torch.zeros(1, 1, DEFAULT_SPEC.hidden_size)
    cos, sin = torch.ones(1, 1, DEFAULT_SPEC.head_dim), torch.zeros(1, 1, DEFAULT_SPEC.head_dim)
    with pytest.raises(ValueError, match="weights or cache were freed"):
        stack(x, cos, sin, 5, torch.ones(1, 1, 6, dtype=torch.bool))


def test_a_stack_takes_laid_out_calls_only(tmp_path):
    model = load(tmp_path)
    layer = model.model.layers[0]
    cache = KVCache.create(model.module_spec, 1, 4, torch.float32)
    call = torch_decode_layer.LayerCall(
        layer._one_call_weights(), cache.k[0], cache.v[0], heads=layer.self_attn.num_heads, eps=1e-6, scale=0.1
    )
    for calls in ([], [call]):
        with pytest.raises(ValueError, match="a stack takes laid-out calls"):
            torch_decode_stack.LayerStack(calls)


@pytest.mark.parametrize("change", ["parameter replaced", "data reassigned", "data restrided"])
def test_a_call_stands_for_its_weights_until_one_changes_where_it_reads(tmp_path, change):
    """What a prepared call checks at every step, unit by unit: the same tensors at the same addresses, shapes,
    strides and dtypes (a weight's memory read with other strides has the same address and shape); a write in place
    changes none of them and the call still stands."""
    model = load(tmp_path)
    layer = model.model.layers[1]
    cache = KVCache.create(model.module_spec, 1, 4, torch.float32)
    call = torch_decode_layer.LayerCall(
        layer._one_call_weights(), cache.k[1], cache.v[1], heads=layer.self_attn.num_heads, eps=1e-6, scale=0.1
    )
    assert call.stands_for(layer._one_call_weights(), cache.k[1], cache.v[1])
    with torch.no_grad():
        write_in_place(model)
        assert call.stands_for(layer._one_call_weights(), cache.k[1], cache.v[1])
        CHANGES[change][1](model)
    assert not call.stands_for(layer._one_call_weights(), cache.k[1], cache.v[1])


def test_a_stacked_step_names_a_bad_operand(tmp_path):
    model = load(tmp_path)
    cache = KVCache.create(model.module_spec, 1, 8, torch.float32)
    with torch.inference_mode(), linear.PATHS.forced("gemv"), torch_decode_ops.decode_steps():
        model([[1, 2]], cache=cache)
    for token in (3, 4):
        step(model, cache, token)
    stack, h, d = model.model._stack, DEFAULT_SPEC.hidden_size, DEFAULT_SPEC.head_dim
    cos, sin, mask = torch.ones(1, 1, d), torch.zeros(1, 1, d), torch.ones(1, 1, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"x must be \[1, 1, 64\]"):
        stack(torch.zeros(1, 1, h + 1), cos, sin, 4, mask)
    with pytest.raises(ValueError, match=r"mask must be \[1, 1, 5\]"):
        stack(torch.zeros(1, 1, h), cos, sin, 4, mask[..., :4])
    with pytest.raises(ValueError, match="slot 8 of 8"):
        stack(torch.zeros(1, 1, h), cos, sin, 8, mask)


@pytest.mark.parametrize("where", ["layer", "global", "attention", "down_proj"])
def test_forward_hooks_see_every_step(tmp_path, where):
    """The stack skips the layers' nn.Module calls and the one call their submodules' forwards: with a forward hook on
    a layer, on a module inside it (or a global one) the layer runs its forward, the hook sees the prompt and every
    decode step, and the logits are those of the run without the hook."""
    model = load(tmp_path)
    plain = generate(model)
    layer = model.model.layers[1]
    watched = {"layer": layer, "global": layer, "attention": layer.self_attn, "down_proj": layer.mlp.down_proj}[where]
    seen = []

    def hook(module, _args, _output):
        if module is watched:
            seen.append(module)

    register = nn.modules.module.register_module_forward_hook if where == "global" else watched.register_forward_hook
    handle = register(hook)
    try:
        hooked = generate(model)
    finally:
        handle.remove()
    assert len(seen) == STEPS  # the prompt, then STEPS - 1 decode steps
    assert all(map(np.array_equal, plain.logits, hooked.logits))


def test_a_model_that_generated_copies_and_pickles_without_its_calls(tmp_path):
    """The prepared calls and the stack hold this process's addresses and weak references: a deep copy or a pickle of
    the model carries none, and the copy prepares its own (the same logits, its own calls)."""
    model = load(tmp_path)
    first = generate(model)
    assert model.model._stack is not None
    twin = copy.deepcopy(model)
    assert twin.model._stack is None and all(layer._one_call_prepared is None for layer in twin.model.layers)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (twin, loaded):
        again = generate(other)
        assert all(map(np.array_equal, first.logits, again.logits))
        assert other.model._stack is not None and other.model._stack is not model.model._stack
