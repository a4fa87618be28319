"""kernels/cpu/decode_layer.c through XLA's FFI (decode_layer_ffi.cc, launcher jax_decode_layer.py) and jax_impl's
DecoderLayer: a generation whose decode steps run each layer in one call agrees with the same generation on XLA's
operators (Qwen3 with q/k norms, Qwen2 with q/k/v biases and one kv head, odd widths, float32 and bfloat16, a padded
batch) to the parity table's bound and to the same greedy tokens; the rule that takes it (decode steps only, every
product on the few-row kernel, full-attention layers); the cache written in place at the step's slot only; errors
that name the operand.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_impl
from jax_impl import layer_choice, linear
from jax_impl.generate import compiled_steps
from jax_impl.kv_cache import KVCache
from jax_impl.layer_choice import LAYERS
from kernels.cpu import build, jax_decode_layer, jax_decode_ops
from parity.tolerances import TOLERANCES
from spec import DEFAULT_SPEC, InputError, ModelSpec
from spec.generation import SamplingParams
from tests.greedy import assert_same_greedy
from tests.kernels.decode_layer_cases import MASK, PROMPT, SPECS, STEPS, needs_kernels, write

pytestmark = needs_kernels


def load(tmp_path, spec: ModelSpec, dtype: str):
    write(tmp_path, spec)
    return jax_impl.from_pretrained(tmp_path, dtype)


@pytest.fixture
def traced(monkeypatch):
    """The number of layer calls traced so far in the test (a compiled step traces each of its layers once)."""
    calls = []
    launch = jax_decode_layer.decode_layer
    monkeypatch.setattr(jax_decode_layer, "decode_layer", lambda *a, **kw: calls.append(1) or launch(*a, **kw))
    return lambda: len(calls)


def generate(model, rows: int = 3, steps: int = STEPS):
    """A compiled step is keyed on the request's shapes, not on the forced paths it was traced under: a test that
    needs a fresh trace asks for a number of steps no other test asks for."""
    return jax_impl.generate(
        model, PROMPT[:rows], steps, attention_mask=MASK[:rows], eos_token_ids=(), return_logits=True
    )


def test_the_kernel_builds_where_it_can():
    """Where gemv.c builds, the layer's XLA binding must too: a broken source fails here instead of the layers
    quietly keeping XLA's operators."""
    assert jax_decode_layer.available(), build.unavailable("decode_layer_xla")


@pytest.mark.parametrize(
    ("shape", "dtype", "rows"),
    [("qwen3", "float32", 1), ("qwen3", "float32", 3), ("qwen3", "bfloat16", 3), ("qwen3-odd", "float32", 3),
     ("qwen3-odd", "bfloat16", 1), ("qwen2-bias", "float32", 3), ("qwen2-bias", "bfloat16", 3)],
)  # fmt: skip
def test_one_call_agrees_with_the_operators_step(tmp_path, traced, shape, dtype, rows):
    """Every step's logits within the parity table's bound for the whole model (two correct implementations of the
    same math: decode_ops.c's norms, RoPE and SwiGLU against XLA's fusions of the reference's, the same products and
    attention), until the first step fed different tokens; the tokens the same up to a near-tie."""
    model = load(tmp_path, SPECS[shape], dtype)
    layers = model.spec.num_hidden_layers
    with LAYERS.forced("one_call"):  # a test model's layer stays in cache: it would keep its operators unmeasured
        one = generate(model, rows)
        assert traced() == layers  # one trace of the decode step, every layer
        with jax_decode_layer.per_operator():
            per = generate(model, rows)
    assert traced() == layers  # none per operator
    bound = TOLERANCES[dtype].bound(layers).max_rel
    assert_same_greedy({"operators": per.tokens, "one call": one.tokens}, per.logits, rel=bound)
    differs = np.flatnonzero((np.array(per.tokens) != np.array(one.tokens)).any(axis=0))
    agree = int(differs[0]) if differs.size else len(per.logits)  # the steps fed the same tokens
    assert agree > 1
    for step, (a, b) in enumerate(zip(one.logits[:agree], per.logits[:agree], strict=True)):
        assert np.abs(a - b).max() <= bound * np.abs(b).max(), step


def test_the_layer_keeps_its_operators_where_the_rule_fails(tmp_path, traced):
    model = load(tmp_path, DEFAULT_SPEC, "float32")
    generate(model, steps=3)  # a test model's layer stays in cache: its operators, unmeasured
    with LAYERS.forced("operators"):
        generate(model, steps=4)
    with LAYERS.forced("one_call"), jax_decode_ops.reference_only():  # the side-by-side reference runs
        generate(model, steps=5)
    with LAYERS.forced("one_call"):
        model(PROMPT, attention_mask=MASK)  # a forward outside generation's decode steps
    assert traced() == 0
    with LAYERS.forced("one_call"):
        generate(model, steps=7)  # the control: a fresh trace that takes it
    assert traced() == model.spec.num_hidden_layers


def test_a_streamed_layer_takes_the_call_by_rule_untimed(tmp_path, traced, monkeypatch):
    """Where the layer's weights count as streamed, the first trace takes the one call by jax_impl/layer_choice.py's
    rule: recorded once for the layers' one shape with no timing and no cost, none of the layers' decode products
    measured (the call computes them on the kernel), every layer traced through the call."""
    monkeypatch.setattr(linear, "MIN_CHOICE_BYTES", 0)
    model = load(tmp_path, DEFAULT_SPEC, "float32")
    saved_layers, saved_paths = LAYERS.chosen(), linear.PATHS.chosen()
    LAYERS.clear()
    linear.PATHS.clear()
    try:
        generate(model, steps=8)  # a fresh trace
        ((key, choice),) = LAYERS.chosen().items()  # both layers share one shape
        assert (choice.path, dict(choice.seconds), choice.cost) == ("one_call", {}, 0.0)
        assert key[:2] == (3, "float32")  # a decode step's three rows
        layer = model.model.layers[0]
        decode_keys = {(3, p.in_features, p.out_features) for p in layer_choice._products(layer)}
        assert not decode_keys & {key[:3] for key in linear.PATHS.chosen()}
        assert traced() == model.spec.num_hidden_layers
    finally:
        LAYERS.clear()
        LAYERS._chosen.update(saved_layers)
        linear.PATHS.clear()
        linear.PATHS._chosen.update(saved_paths)


def test_sliding_layers_keep_their_operators(tmp_path, traced):
    spec = dataclasses.replace(  # Qwen3 with its first layer sliding (max_window_layers)
        DEFAULT_SPEC, sliding_window=4, layer_types=("sliding_attention", "full_attention")
    )
    model = load(tmp_path, spec, "float32")
    with LAYERS.forced("one_call"):
        one = generate(model)
        with jax_decode_layer.per_operator():
            per = generate(model)
    assert traced() == 1  # the full layer only: the sliding one attends over its ring
    assert_same_greedy({"operators": per.tokens, "one call": one.tokens}, per.logits)


def _operands(b=1, hidden=16, heads=2, kv=1, d=8, inter=12, slots=4, dtype=jnp.float32):
    """A layer whose products are all zero (Flax's [in, out] kernels) over a cache of ones."""
    zeros = lambda *shape: jnp.zeros(shape, dtype)  # noqa: E731
    w = jax_decode_layer.LayerWeights(
        jnp.ones(hidden, dtype), jnp.ones(hidden, dtype), jnp.ones(d, dtype), jnp.ones(d, dtype),
        zeros(hidden, heads * d), zeros(hidden, kv * d), zeros(hidden, kv * d), zeros(heads * d, hidden),
        zeros(hidden, 2 * inter), zeros(inter, hidden),
    )  # fmt: skip
    x = jnp.asarray(np.random.default_rng(0).standard_normal((b, 1, hidden)), dtype)
    return dict(
        x=x, residual=x + 1, weights=w, cos=jnp.ones((b, 1, d)), sin=jnp.zeros((b, 1, d)),
        k_cache=jnp.ones((b, kv, slots, d), dtype), v_cache=jnp.ones((b, kv, d, slots), dtype), pos=1,
        mask=jnp.ones((b, 1, slots), bool), heads=heads, eps=1e-6, scale=0.5,
    )  # fmt: skip


@pytest.mark.parametrize(("pos", "written"), [(1, 1), (0, 0), (9, 3)])  # 9 >= S: the last slot, as DUS clamps
def test_the_launcher_runs_a_layer_of_zero_products(pos, written):
    """Zero products: the increment is zero whatever the attention reads, the new residual is x + residual (exact in
    float32 here), and the step's zero keys and values land in slot `pos` of the cache (traced) and nowhere else."""
    args = _operands()

    def step(pos, k_cache, v_cache):  # the slot traced, as in a decode step
        return jax_decode_layer.decode_layer(**{**args, "pos": pos, "k_cache": k_cache, "v_cache": v_cache})

    out, residual, k, v = jax.jit(step)(jnp.asarray(pos, jnp.int32), args["k_cache"], args["v_cache"])
    assert not out.any()
    assert np.array_equal(residual, args["x"] + args["residual"])
    others = [s for s in range(4) if s != written]
    assert not k[:, :, written].any() and not v[..., written].any()
    assert (k[:, :, others] == 1).all() and (v[..., others] == 1).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {"weights": dataclasses.replace(a["weights"], wq=jnp.zeros((16, 15)))}, r"wq must be \[16, 16\]"),
        (lambda a: {"weights": dataclasses.replace(a["weights"], wd=jnp.zeros((12, 15)))}, r"wd must be \[12, 16\]"),
        (lambda a: {"weights": dataclasses.replace(a["weights"], k_norm=None)}, "q_norm and k_norm come together"),
        (lambda a: {"cos": jnp.ones((1, 1, 8), jnp.bfloat16)}, "cos must be"),
        (lambda a: {"mask": jnp.ones((1, 1, 3), bool)}, r"mask must be \[1, 1, 4\]"),
        (lambda a: {"v_cache": jnp.zeros((1, 1, 4, 8))}, r"v_cache must be \[1, 1, 8, 4\]"),
        (lambda a: {"x": jnp.zeros((1, 2, 16))}, r"x must be \[B, 1, H\]"),
        (lambda a: {"heads": 3}, "3 heads over 1 kv heads|wq must be"),
    ],
)  # fmt: skip
def test_bad_operands_name_the_tensor(change, message):
    args = _operands()
    args.update(change(args))
    with pytest.raises(ValueError, match=message):
        jax_decode_layer.decode_layer(**args)


def test_a_full_cache_is_refused_on_the_host(tmp_path, traced):
    """A decode step past the cache's capacity writes the last slot (as the operators' dynamic_update_slice would)
    and records the slot asked for: KVCache.check refuses it, as it refuses the operators' step."""
    model = load(tmp_path, DEFAULT_SPEC, "float32")
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    prefill, decode = compiled_steps(graphdef, treedef, SamplingParams(0.0, None, None, 0))
    cache = KVCache.create(model.module_spec, 1, 2, jnp.float32)  # room for the prompt only
    key_valid, key, eos = np.ones((1, 2), bool), jax.random.key(0), jnp.zeros((0,), jnp.int32)
    with LAYERS.forced("one_call"):
        token, _, cache, finished = prefill(leaves, cache, np.array([[1, 2]], np.int32), key_valid, key, eos)
        cache.check()
        token, _, cache, _, _ = decode(leaves, cache, token, jnp.asarray(key_valid), finished, key, eos)
    assert traced() == model.spec.num_hidden_layers
    with pytest.raises(InputError, match="KV cache is full: 3 positions requested, capacity 2"):
        cache.check()
