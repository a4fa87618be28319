"""torch_impl/kv_cache.py: layouts, filled slots, and the refusal of a write past capacity (twin of
tests/jax_impl/test_kv_cache.py, same cases)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spec
import torch_impl
from spec import InputError
from torch_impl import KVCache

SPEC = spec.DEFAULT_SPEC  # 2 layers, 2 kv heads, head_dim 24


def _kv(t: int, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    n_kv, d = SPEC.num_key_value_heads, SPEC.head_dim
    return torch.full((1, n_kv, t, d), fill), torch.full((1, n_kv, d, t), fill)  # k [B, n_kv, T, d], v [.., d, T]


def test_layouts_and_filled_slots():
    cache = KVCache.create(SPEC, 1, 5, torch.float32)
    assert len(cache.k) == SPEC.num_hidden_layers  # per layer, as JAX's (a sliding layer's ring is smaller)
    assert tuple(cache.k[0].shape) == (1, SPEC.num_key_value_heads, 5, SPEC.head_dim)
    assert tuple(cache.v[0].shape) == (1, SPEC.num_key_value_heads, SPEC.head_dim, 5)
    k, v = cache.update(0, *_kv(3, 1.0))
    assert k.shape[2] == 3 and v.shape[3] == 3 and bool((k == 1).all())
    cache.advance(3)
    k, v = cache.update(0, *_kv(2, 2.0))  # fills the cache exactly
    assert k.shape[2] == 5 and torch.equal(k[0, 0, :, 0], torch.tensor([1.0, 1, 1, 2, 2]))


def test_write_past_capacity_is_refused():
    cache = KVCache.create(SPEC, 1, 4, torch.float32)
    cache.update(0, *_kv(3, 1.0))
    cache.advance(3)
    before = cache.k[0].clone()
    with pytest.raises(InputError, match=r"KV cache is full: 5 positions requested, capacity 4"):
        cache.update(0, *_kv(2, 9.0))
    # nothing was written, bit for bit: a full layer's unwritten slots hold whatever torch.empty left, NaN bits
    # included, which torch.equal would call unequal to themselves
    assert torch.equal(cache.k[0].view(torch.int32), before.view(torch.int32))


def test_cache_larger_than_the_model_is_refused():
    with pytest.raises(InputError, match="exceeds max_position_embeddings"):
        KVCache.create(SPEC, 1, SPEC.max_position_embeddings + 1, torch.float32)


def test_model_forward_past_capacity_is_refused(default_dir):
    model = torch_impl.from_pretrained(default_dir)
    cache = KVCache.create(model.module_spec, 1, 4, torch.float32)
    with torch.inference_mode():
        model(np.array([[1, 2, 3]]), cache=cache)
        with pytest.raises(InputError, match="KV cache is full"):
            model(np.array([[4, 5]]), attention_mask=np.ones((1, 5), dtype=int), cache=cache)


@pytest.mark.parametrize("operators", ["kernels", "reference"])
def test_a_full_layers_unwritten_slots_are_never_read(default_dir, monkeypatch, operators):
    """create leaves a full layer's buffers unwritten: a generation over buffers holding NaN before it starts equals,
    bit for bit, one over zeros (the CPU kernels' decode steps and prompt, and the reference operators')."""
    import contextlib

    from kernels.cpu import torch_decode_ops

    model = torch_impl.from_pretrained(default_dir)
    prompt, created = [[5, 9, 200, 17]], KVCache.create

    def run(fill: float):
        def create(*args, **kwargs):
            cache = created(*args, **kwargs)
            for k, v, ring in zip(cache.k, cache.v, cache.ring, strict=True):
                if not ring:
                    k.fill_(fill), v.fill_(fill)
            return cache

        with monkeypatch.context() as patch:
            patch.setattr(KVCache, "create", create)
            off = torch_decode_ops.reference_only() if operators == "reference" else contextlib.nullcontext()
            with off:
                return torch_impl.generate(model, prompt, 6, eos_token_ids=(), return_logits=True)

    zeros, nans = run(0.0), run(float("nan"))
    assert nans.tokens == zeros.tokens
    for a, b in zip(nans.logits, zeros.logits, strict=True):
        np.testing.assert_array_equal(a, b)
