"""kernels/cpu/decode_layer.c through its torch launcher (torch_decode_layer.py) and torch_impl's DecoderLayer: a
decode step of a whole layer in one call is the per-operator step bit for bit (Qwen3 with q/k norms, Qwen2 with
q/k/v biases and one kv head, odd widths, float32 and bfloat16, a padded batch); the rule that takes it (decode steps
only, every product on the few-row kernel as the choices say, full-attention layers, and asked again after the
choices are cleared); errors that name the operand, and a full cache refused as cache.update refuses it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import torch_impl
from kernels.cpu import torch_decode_layer, torch_decode_ops, torch_decode_stack
from spec import DEFAULT_SPEC, InputError, ModelSpec
from spec.path_choice import Choice
from tests.kernels.decode_layer_cases import MASK, PROMPT, SPECS, STEPS, needs_kernels, write
from torch_impl import layer_choice, linear
from torch_impl.kv_cache import KVCache

pytestmark = needs_kernels


def load(tmp_path, spec: ModelSpec, dtype: str):
    write(tmp_path, spec)
    return torch_impl.from_pretrained(tmp_path, dtype)


@pytest.fixture
def count_calls():
    """The number of layers decode_layer.c has run so far in the test: one a call of a layer, n a stack's call of n
    (each dtype's functions wrapped); `stacks()` counts the stack calls alone."""
    tables = torch_decode_layer._functions(), torch_decode_stack._stack_functions()
    saved = [dict(table) for table in tables]
    layers, stacks = [0], [0]

    def one(fn):
        def call(layer):
            layers[0] += 1
            return fn(layer)

        return call

    def stack(fn):
        def call(array, n):
            layers[0] += n
            stacks[0] += 1
            return fn(array, n)

        return call

    for table, wrap in zip(tables, (one, stack), strict=True):
        table.update({dtype: wrap(fn) for dtype, fn in table.items()})
    counted = lambda: layers[0]  # noqa: E731
    counted.stacks = lambda: stacks[0]
    yield counted
    for table, kept in zip(tables, saved, strict=True):
        table.update(kept)


def generate(model, rows: int = 3, **kwargs):
    return torch_impl.generate(
        model, PROMPT[:rows], STEPS, attention_mask=MASK[:rows], eos_token_ids=(), return_logits=True, **kwargs
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", list(SPECS))
@pytest.mark.parametrize("rows", [1, 3])
def test_one_call_is_the_per_operator_step_bit_for_bit(tmp_path, count_calls, shape, dtype, rows):
    model = load(tmp_path, SPECS[shape], dtype)
    with linear.PATHS.forced("gemv"):  # a test model's weights would keep F.linear unmeasured
        one = generate(model, rows)
        assert count_calls() == (STEPS - 1) * model.spec.num_hidden_layers  # every decode step, every layer
        assert count_calls.stacks() == STEPS - 2  # the first step lays each layer's call out, the rest are stacked
        with torch_decode_layer.per_operator():
            per = generate(model, rows)
    assert count_calls() == (STEPS - 1) * model.spec.num_hidden_layers  # none more per operator
    assert np.array_equal(one.tokens, per.tokens)
    for step, (a, b) in enumerate(zip(one.logits, per.logits, strict=True)):
        assert np.array_equal(a, b), step


def test_the_layer_keeps_its_operators_where_the_rule_fails(tmp_path, count_calls):
    model = load(tmp_path, DEFAULT_SPEC, "float32")
    generate(model)  # a test model's products keep F.linear (too small to measure): not the kernel's
    with linear.PATHS.forced("onednn" if "onednn" in linear.PATHS.paths else "f_linear"):
        generate(model)
    with linear.PATHS.forced("gemv"), torch_decode_ops.reference_only():  # the side-by-side reference runs
        generate(model)
    with linear.PATHS.forced("gemv"), layer_choice.LAYERS.forced("operators"):  # the layer's own pin
        generate(model)
    with linear.PATHS.forced("f_linear"), layer_choice.LAYERS.forced("one_call"):  # products pinned elsewhere
        generate(model)
    with linear.PATHS.forced("gemv"):
        model(PROMPT, attention_mask=MASK)  # a forward outside generation's decode steps
        with torch_decode_ops.decode_steps():
            model([[1, 2], [3, 4], [5, 6]])  # two tokens a row: a prompt, not a step
    assert count_calls() == 0


def test_sliding_layers_keep_their_operators(tmp_path, count_calls):
    spec = dataclasses.replace(  # Qwen3 with its first layer sliding (max_window_layers)
        DEFAULT_SPEC, sliding_window=4, layer_types=("sliding_attention", "full_attention")
    )
    model = load(tmp_path, spec, "float32")
    with linear.PATHS.forced("gemv"):
        one = generate(model)
        with torch_decode_layer.per_operator():
            per = generate(model)
    assert count_calls() == STEPS - 1  # the full layer only: the sliding one attends over its ring
    assert np.array_equal(one.tokens, per.tokens) and all(map(np.array_equal, one.logits, per.logits))


def test_the_layers_own_choice_decides_and_is_asked_again_once_cleared(tmp_path, count_calls):
    """The layer takes one call where its own choice (torch_impl/layer_choice.py) says so, whatever one product's
    choice says (o_proj on F.linear here); once the choices are cleared and it says operators, it does not (what the
    layer learnt is keyed on both choices' versions). Unsettled, it times both paths on a scratch cache, takes what it
    chose, leaves the generation bit for bit as the operators' and charges its time to linear.PATHS."""
    model = load(tmp_path, DEFAULT_SPEC, "float32")
    layer = model.model.layers[0]
    products = layer_choice._products(layer)
    key = (3, "float32", tuple(tuple(p.weight.shape) for p in products), layer.self_attn.q_norm is not None, False)

    def settle(layer_path: str | None, product_paths: list[str]) -> None:
        linear.PATHS.clear()
        layer_choice.LAYERS.clear()
        for product, path in zip(products, product_paths, strict=True):
            out, into = product.weight.shape
            linear.PATHS._chosen[(3, into, out, "float32", False)] = Choice(path, {}, 0.0)
        if layer_path is not None:
            layer_choice.LAYERS._chosen[key] = Choice(layer_path, {}, 0.0)

    original = linear.MIN_CHOICE_BYTES
    try:
        linear.MIN_CHOICE_BYTES = 0  # the test model's weights take their recorded choices, or are measured
        settle("one_call", ["gemv"] * 3 + ["f_linear"] + ["gemv"] * 2)
        generate(model)
        assert count_calls() == (STEPS - 1) * 2 and count_calls.stacks() == STEPS - 2
        settle("operators", ["gemv"] * 6)
        generate(model)
        assert count_calls() == (STEPS - 1) * 2 and count_calls.stacks() == STEPS - 2  # none more
        settle(None, ["gemv"] * 6)
        measured = generate(model)
        chosen = layer_choice.LAYERS.chosen()[key]
        assert set(chosen.seconds) == {"one_call", "operators"}
        assert count_calls.stacks() == (STEPS - 2) * (2 if chosen.path == "one_call" else 1)
        charged = linear.PATHS.cost() - sum(c.cost for c in linear.PATHS.chosen().values())  # beyond the products'
        assert charged == pytest.approx(chosen.cost)  # the step's products were settled: the layer's time alone
        with torch_decode_layer.per_operator():
            per = generate(model)
        assert np.array_equal(measured.tokens, per.tokens) and all(map(np.array_equal, measured.logits, per.logits))
    finally:
        linear.MIN_CHOICE_BYTES = original
        linear.PATHS.clear()
        layer_choice.LAYERS.clear()


def test_a_full_cache_is_refused_as_cache_update_refuses_it(tmp_path):
    model = load(tmp_path, DEFAULT_SPEC, "float32")
    cache = KVCache.create(model.module_spec, 1, 2, torch.float32)
    with torch.inference_mode(), linear.PATHS.forced("gemv"), torch_decode_ops.decode_steps():
        model([[1, 2]], cache=cache)  # fills both slots
        with pytest.raises(InputError, match="KV cache is full: 3 positions requested, capacity 2"):
            model([[3]], cache=cache, attention_mask=torch.ones(1, 3, dtype=torch.long))


def _operands(b: int = 1, hidden: int = 16, heads: int = 2, kv: int = 1, d: int = 8, inter: int = 12, slots: int = 4):
    w = torch_decode_layer.LayerWeights(
        torch.ones(hidden), torch.ones(hidden), torch.ones(d), torch.ones(d), torch.zeros(heads * d, hidden),
        torch.zeros(kv * d, hidden), torch.zeros(kv * d, hidden), torch.zeros(hidden, heads * d),
        torch.zeros(2 * inter, hidden), torch.zeros(hidden, inter),
    )  # fmt: skip
    x = torch.randn(b, 1, hidden)
    cos, sin = torch.ones(b, 1, d), torch.zeros(b, 1, d)
    k_cache, v_cache = torch.ones(b, kv, slots, d), torch.ones(b, kv, d, slots)  # ones: a written slot shows
    mask = torch.ones(b, 1, 2, dtype=torch.bool)
    return dict(x=x, residual=x.clone(), weights=w, cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache, pos=1,
                mask=mask, heads=heads, eps=1e-6, scale=0.5)  # fmt: skip


def test_the_launcher_runs_a_layer_of_zero_products():
    """With every product weight zero the layer's increment is zero whatever the attention reads, the new residual is
    the input plus the old residual (add_rms_norm's rounding: exact here in float32 sums of two), and the step's
    zero keys and values land in slot `pos` of a cache of ones, and nowhere else."""
    args = _operands()
    out, residual = torch_decode_layer.decode_layer(**args)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(residual, args["x"] + args["residual"])
    assert torch.equal(args["k_cache"][:, :, 1], torch.zeros(1, 1, 8))  # slot 1 written (zeros, normed: zeros)
    assert torch.equal(args["v_cache"][..., 1], torch.zeros(1, 1, 8))
    assert torch.equal(args["k_cache"][:, :, [0, 2, 3]], torch.ones(1, 1, 3, 8))  # no other slot touched


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: dataclasses.replace(a["weights"], wq=torch.zeros(15, 16)), r"wq must be \[16, 16\]"),
        (lambda a: dataclasses.replace(a["weights"], k_norm=None), "q_norm and k_norm come together"),
        (lambda a: dataclasses.replace(a["weights"], wd=torch.zeros(16, 12, dtype=torch.float64)), "wd must be"),
    ],
)  # fmt: skip
def test_bad_weights_name_the_tensor(change, message):
    args = _operands()
    args["weights"] = change(args)
    with pytest.raises(ValueError, match=message):
        torch_decode_layer.decode_layer(**args)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("cos", torch.ones(1, 1, 8, dtype=torch.float64), "cos must be"),
        ("mask", torch.ones(1, 1, 3, dtype=torch.bool), r"mask must be \[1, 1, 2\]"),
        ("pos", 4, "slot 4 of 4"),
        ("x", torch.zeros(1, 2, 16), r"x must be \[B, 1, H\]"),
        ("v_cache", torch.zeros(1, 1, 4, 8), r"v_cache must be \[1, 1, 8, 4\]"),
    ],
)
def test_bad_operands_name_the_tensor(name, value, message):
    args = _operands()
    args[name] = value
    with pytest.raises(ValueError, match=message):
        torch_decode_layer.decode_layer(**args)
