"""kernels/cpu/attend.c's attention through its JAX launcher (jax_decode_ops.py, XLA FFI in decode_ops_ffi.cc):
against jax_impl.attention.attend, the reference it stands in for in a decode step and a prompt, held to the kernel
tolerance table's "attention" rows (odd head widths, float32 and bfloat16, several batch rows, soft-capping, slots past
the written ones holding NaN that must never be read, a fully masked row, causal prompts); the rule that decides when
jax_impl takes it (generation's decode steps and prompt only, read while tracing); a whole generation through it
against the same generation on the reference; and errors that name the operands.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_impl
import spec
from jax_impl.attention import attend
from jax_impl.kv_cache import KVCache
from kernels.cpu import build, jax_decode_ops
from tests.greedy import assert_same_greedy
from tests.kernels.tolerances import assert_within_tolerance

CAN_BUILD = build._unsupported() is None  # x86-64 with AVX2 and FMA, and a C compiler: every CI machine
pytestmark = pytest.mark.skipif(not CAN_BUILD, reason=f"the CPU kernels cannot be built here: {build._unsupported()}")
DTYPES = ["float32", "bfloat16"]


def randn(*shape: int, dtype: str, seed: int, scale: float = 2.0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, dtype)


def operands(b, t, n_kv, g, d, slots, keys, dtype, seed=0):
    """q, k, v, mask as a decode step hands them over: a cache of `slots` slots of which `keys` are written; the
    unwritten ones hold NaN (the kernel must not read them) and are masked, as the step's mask masks them."""
    q = randn(b, t, n_kv, g, d, dtype=dtype, seed=seed)
    written = jnp.arange(slots) < keys  # [S]
    k = jnp.where(written[:, None], randn(b, n_kv, slots, d, dtype=dtype, seed=seed + 1), jnp.nan)
    v = jnp.where(written, randn(b, n_kv, d, slots, dtype=dtype, seed=seed + 2), jnp.nan)
    mask = jnp.asarray(np.random.default_rng(seed + 3).random((b, t, slots)) > 0.3).at[:, :, 0].set(True)
    return q, k, v, mask & written


def test_the_kernel_builds_where_it_can():
    """Where gemv.c builds, the attention's XLA binding must too: a broken source fails here instead of the layers
    quietly keeping the reference."""
    assert jax_decode_ops.available(), build.unavailable("decode_ops_xla")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("b", "t", "n_kv", "g", "d", "slots", "keys"),
    [(1, 1, 8, 2, 128, 40, 25), (2, 1, 3, 1, 7, 5, 1), (3, 2, 2, 3, 20, 41, 37), (1, 1, 2, 2, 16, 9, 9)],
)
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_attention_matches_the_reference(dtype, b, t, n_kv, g, d, slots, keys, softcap):
    q, k, v, mask = operands(b, t, n_kv, g, d, slots, keys, dtype, seed=d + keys)
    out = jax.jit(lambda *a: jax_decode_ops.attend(*a, d**-0.5, softcap, keys=keys))(q, k, v, mask)
    zero = jnp.arange(slots) < keys  # the reference is handed zeros there, as the cache's `update` zeroes them
    ref = attend(q, jnp.where(zero[:, None], k, 0), jnp.where(zero, v, 0), mask, d**-0.5, softcap)
    assert out.shape == q.shape and out.dtype == jnp.dtype(dtype)
    assert_within_tolerance(np.asarray(out, np.float32), np.asarray(ref, np.float32), "attention", dtype)


def test_the_slots_read_follow_a_traced_count():
    """`keys` is a traced scalar inside a decode step (the cache's length): each value reads that many slots."""
    q, k, v, mask = operands(1, 1, 2, 2, 16, 12, 12, "float32")
    run = jax.jit(lambda keys: jax_decode_ops.attend(q, k, v, mask, 0.25, keys=keys))
    for keys in (1, 5, 12):
        visible = mask & (jnp.arange(12) < keys)
        ref = attend(q, k, v, visible, 0.25)
        assert_within_tolerance(np.asarray(run(keys)), np.asarray(ref), "attention", "float32", f"keys {keys}")


def test_a_fully_masked_row_is_the_mean_of_the_slots_read_not_nan():
    q, k, v, mask = operands(2, 1, 2, 2, 16, 12, 9, "float32")
    mask = mask.at[1].set(False)  # a padding row: nothing to attend to
    out = jax_decode_ops.attend(q, k, v, mask, 0.25, keys=9)
    ref = attend(q, k[:, :, :9], v[..., :9], mask[..., :9], 0.25)  # the reference over the slots read
    assert bool(jnp.isfinite(out).all())
    assert_within_tolerance(np.asarray(out), np.asarray(ref), "attention", "float32")


def test_the_rule_takes_generations_decode_steps_only():
    """Inside generate's `decode_steps()` only: one token per row, at most MAX_ROWS rows, float32/bfloat16 operands
    of one dtype, no mesh."""
    q, k, v = jnp.zeros((2, 1, 2, 2, 8)), jnp.zeros((2, 2, 4, 8)), jnp.zeros((2, 2, 8, 4))
    assert not jax_decode_ops.takes(q, k, v)  # a one-token forward outside generation: a parity trace
    with jax_decode_ops.decode_steps():
        assert jax_decode_ops.takes(q, k, v)
        assert not jax_decode_ops.takes(jnp.zeros((2, 3, 2, 2, 8)), k, v)  # several tokens a row
        assert not jax_decode_ops.takes(jnp.zeros((jax_decode_ops.MAX_ROWS + 1, 1, 2, 2, 8)), k, v)
        assert not jax_decode_ops.takes(q.astype(jnp.float16), k.astype(jnp.float16), v.astype(jnp.float16))
        assert not jax_decode_ops.takes(q, k.astype(jnp.bfloat16), v)  # mixed dtypes
        with jax_decode_ops.reference_only():
            assert not jax_decode_ops.takes(q, k, v)
            assert not jax_decode_ops.enabled()
        with jax.set_mesh(jax.make_mesh((1,), ("data",))):  # the partitioner owns a sharded step's layout
            assert not jax_decode_ops.takes(q, k, v)
    assert jax_decode_ops.enabled()


def test_a_prompt_takes_the_kernel_at_any_length():
    """Inside `prompts()`: any rows and steps; the other conditions as in decode steps."""
    q, k, v = jnp.zeros((9, 17, 2, 2, 8)), jnp.zeros((9, 2, 17, 8)), jnp.zeros((9, 2, 8, 17))
    assert not jax_decode_ops.takes(q, k, v)
    with jax_decode_ops.prompts():
        assert jax_decode_ops.takes(q, k, v)
        assert not jax_decode_ops.takes(q, k.astype(jnp.bfloat16), v)
        with jax_decode_ops.reference_only():
            assert not jax_decode_ops.takes(q, k, v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("b", "t", "n_kv", "g", "d"), [(1, 128, 8, 2, 128), (2, 37, 3, 3, 20), (1, 17, 2, 8, 7)])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_a_prompts_attention_matches_the_reference(dtype, b, t, n_kv, g, d, softcap):
    """A causal prompt (the second row left-padded by two slots) through the blocked kernel, as the prefill hands it
    over: keys and values of the prompt's own t slots."""
    q = randn(b, t, n_kv, g, d, dtype=dtype, seed=t)
    k, v = randn(b, n_kv, t, d, dtype=dtype, seed=t + 1), randn(b, n_kv, d, t, dtype=dtype, seed=t + 2)
    mask = jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0)
    mask = mask.at[1:, :, :2].set(False) if b > 1 else mask
    out = jax.jit(lambda *a: jax_decode_ops.attend(*a, d**-0.5, softcap))(q, k, v, mask)
    ref = attend(q, k, v, mask, d**-0.5, softcap)
    assert out.shape == q.shape and bool(jnp.isfinite(out.astype(jnp.float32)).all())
    assert_within_tolerance(np.asarray(out, np.float32), np.asarray(ref, np.float32), "attention", dtype)


def test_bad_operands_name_the_problem():
    q, k, v = jnp.zeros((1, 1, 2, 1, 8)), jnp.zeros((1, 2, 3, 8)), jnp.zeros((1, 2, 8, 3))
    with pytest.raises(ValueError, match=r"mask \[B, T, S\] bool; got .*mask \(1, 1, 3\) float32"):
        jax_decode_ops.attend(q, k, v, jnp.ones((1, 1, 3)), 1.0)
    with pytest.raises(ValueError, match=r"k \(1, 2, 4, 8\)"):
        jax_decode_ops.attend(q, jnp.zeros((1, 2, 4, 8)), v, jnp.ones((1, 1, 3), bool), 1.0)
    with pytest.raises(ValueError, match="of one dtype"):
        jax_decode_ops.attend(q, k.astype(jnp.bfloat16), v, jnp.ones((1, 1, 3), bool), 1.0)


def test_the_cache_hands_out_its_buffers_unzeroed_on_full_layers_only():
    cache = KVCache(
        (jnp.full((1, 1, 4, 2), 7.0), jnp.full((1, 1, 2, 2), 7.0)),
        (jnp.full((1, 1, 2, 4), 7.0), jnp.full((1, 1, 2, 2), 7.0)),
        jnp.asarray(1, jnp.int32),
        jnp.asarray(1, jnp.int32),
        max_len=4,
        ring=(False, True),
    )
    new_k, new_v = jnp.ones((1, 1, 1, 2)), jnp.ones((1, 1, 2, 1))
    _, k, v = cache.update(0, new_k, new_v, zeroed=False)
    assert k[0, 0, :, 0].tolist() == [7.0, 1.0, 7.0, 7.0]  # slot 1 written, the rest as the buffer held them
    assert v[0, 0, 0].tolist() == [7.0, 1.0, 7.0, 7.0]
    _, k, _ = cache.update(0, new_k, new_v)
    assert k[0, 0, :, 0].tolist() == [7.0, 1.0, 0.0, 0.0]  # zeroed past the written slots (slot 0 kept)
    with pytest.raises(ValueError, match="layer 1 keeps a ring"):
        cache.update(1, new_k, new_v, zeroed=False)


def test_generation_through_the_kernel_equals_the_reference(tmp_path, monkeypatch):
    """The default checkpoint decoded greedily, float32, two rows of different prompt lengths (left padding): the
    same tokens (up to a near-tie, tests/greedy.py), and every step's logits within the float32 parity bound of the
    generation kept on the reference. The kernel is traced into the prompt and the decode step once per layer each,
    and not at all under reference_only(), which compiles steps of its own."""
    from parity.tolerances import TOLERANCES

    model = jax_impl.from_pretrained(spec.default_checkpoint(tmp_path))
    prompt = [[5, 9, 200, 17], [3, 1, 4]]
    traced = []
    launch = jax_decode_ops.attend
    monkeypatch.setattr(jax_decode_ops, "attend", lambda *a, **kw: traced.append(1) or launch(*a, **kw))
    fast = jax_impl.generate(model, prompt, 8, eos_token_ids=(), return_logits=True)
    assert len(traced) == 2 * model.spec.num_hidden_layers  # one trace of the prompt and the step, every layer
    with jax_decode_ops.reference_only():
        ref = jax_impl.generate(model, prompt, 8, eos_token_ids=(), return_logits=True)
    assert len(traced) == 2 * model.spec.num_hidden_layers
    assert_same_greedy({"reference": ref.tokens, "kernel": fast.tokens}, ref.logits)
    differs = np.flatnonzero((np.array(ref.tokens) != np.array(fast.tokens)).any(axis=0))
    agree = int(differs[0]) if differs.size else len(ref.logits)  # the steps fed the same tokens
    bound = TOLERANCES["float32"].max_rel
    for step, (a, b) in enumerate(zip(fast.logits[:agree], ref.logits[:agree], strict=True)):
        assert np.abs(a - b).max() <= bound * np.abs(b).max(), step
