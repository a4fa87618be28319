"""The window-bounded KV cache both backends must share (issue 15): a sliding layer keeps a ring of its window's
slots, not one per position, and generation through it stays what transformers and the uncached forward give.

One body for both twins: tests/torch_impl/test_window_cache.py and tests/jax_impl/test_window_cache.py subclass
`WindowCacheTwin` with their backend's name and its chunked cached forward (`cached_logits`, the one thing the
two backends spell differently: torch's cache is updated in place, JAX's is returned). pytest collects the
subclasses, never this module. Checkpoints are transformers-written (tests/hf_configs.py FAMILY_CONFIGS, windows
5 to 7); prompts of 9 tokens and 24 new ones go well past every window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from spec import ModelSpec
from tests.backends import load, package, rel_err, run
from tests.greedy import FP32_REL, assert_same_greedy
from tests.hf_configs import FAMILY_CONFIGS

SLIDING_FAMILIES = ["mistral_window", "gemma2_sandwich", "gemma3_local_global"]
PROMPT, NEW_TOKENS = 9, 24

# Mistral 7B's shape (v0.1: a 4096 window on every layer) at a 32768-position request, batch 1, bfloat16.
MISTRAL_7B = dict(
    model_type="mistral",
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    sliding_window=4096,
    max_position_embeddings=32768,
    rms_norm_eps=1e-5,
    rope_theta=10_000.0,
    hidden_act="silu",
)
GIB = 2**30


def hf_greedy(directory: Path, ids: np.ndarray, mask: np.ndarray, n: int) -> list[list[int]]:
    """transformers' greedy continuation (eager attention, its own sliding-window cache) of left-padded ids."""
    import torch

    from parity.hf_reference import load_hf

    model = load_hf(directory, "float32")
    with torch.inference_mode():
        out = model.generate(
            torch.as_tensor(ids),
            attention_mask=torch.as_tensor(mask),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[:, ids.shape[1] :].tolist()


def left_padded(prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of different lengths -> ids [B, T] and mask [B, T], padding (id 0, mask 0) on the left."""
    width = max(len(p) for p in prompts)
    ids, mask = np.zeros((len(prompts), width), np.int64), np.zeros((len(prompts), width), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = prompt, 1
    return ids, mask


class WindowCacheTwin:
    backend: ClassVar[str]  # "torch" | "jax"

    def create_cache(self, spec: ModelSpec, batch: int, max_len: int, *, abstract: bool = False) -> Any:
        """The backend's KVCache.create in bfloat16; `abstract`: shapes only, no memory (torch's meta device,
        jax.eval_shape), for sizes too large to allocate in a test."""
        raise NotImplementedError

    def cached_logits(self, model: Any, ids: np.ndarray, chunk: int) -> np.ndarray:
        """Logits [B, S, V] of ids [B, S] fed through one KV cache `chunk` tokens per forward."""
        raise NotImplementedError

    @staticmethod
    def slots(cache: Any) -> list[int]:
        return [int(k.shape[2]) for k in cache.k]

    @staticmethod
    def nbytes(cache: Any) -> int:
        return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in (*cache.k, *cache.v))

    @pytest.mark.parametrize("name", SLIDING_FAMILIES)
    def test_sliding_layers_keep_window_slots_full_layers_max_len(self, name, hf_checkpoint):
        spec = ModelSpec.from_pretrained(hf_checkpoint(name))
        window, max_len = spec.sliding_window, PROMPT + NEW_TOKENS
        cache = self.create_cache(spec, 2, max_len)
        want = [max_len if spec.window(i) is None else window for i in range(spec.num_hidden_layers)]
        assert self.slots(cache) == want
        assert all(v.shape[3] == s for v, s in zip(cache.v, want, strict=True))
        assert cache.max_len == max_len  # the positions accepted, on ring layers too
        # A request shorter than the window: a ring no longer than the request.
        assert self.slots(self.create_cache(spec, 1, window - 2)) == [window - 2] * spec.num_hidden_layers

    def test_mistral_7b_cache_memory(self):
        """A 4096 window at a 32768-position request: 1/8 of the per-position cache (4 GiB -> 0.5 GiB)."""
        spec = ModelSpec.from_hf_config(MISTRAL_7B)
        cache = self.create_cache(spec, 1, 32768, abstract=True)
        assert self.slots(cache) == [4096] * 32
        per_position = 2 * 32 * 8 * 128 * 32768 * 2  # k and v, layers, kv heads, head_dim, positions, bf16 bytes
        assert per_position == 4 * GIB
        assert self.nbytes(cache) == per_position // 8 == GIB // 2
        print(f"Mistral 7B shape, window 4096, 32768 positions: {per_position / GIB:.2f} GiB -> "
              f"{self.nbytes(cache) / GIB:.2f} GiB")  # fmt: skip

    def test_non_sliding_model_keeps_every_slot(self, default_dir):
        spec = ModelSpec.from_pretrained(default_dir)
        assert self.slots(self.create_cache(spec, 1, 20)) == [20] * spec.num_hidden_layers
        assert not any(self.create_cache(spec, 1, 20).ring)

    @pytest.mark.parametrize("name", SLIDING_FAMILIES)
    def test_greedy_matches_transformers_past_the_window(self, name, hf_checkpoint):
        """One full 9-token prompt, then a left-padded batch (9 and 5 tokens), then a one-token prompt (its prefill
        has a decode step's shape): 24 new tokens each, so the ring wraps several times, and left padding occupies
        window slots (as in transformers)."""
        directory = hf_checkpoint(name)
        model = load(self.backend, directory)
        rng = np.random.default_rng(11)
        vocab = FAMILY_CONFIGS[name]["vocab_size"]
        for prompts in (
            [rng.integers(1, vocab, PROMPT).tolist()],
            [rng.integers(1, vocab, n).tolist() for n in (9, 5)],
            [rng.integers(1, vocab, 1).tolist()],
        ):
            ids, mask = left_padded(prompts)
            out = package(self.backend).generate(model, prompts, NEW_TOKENS, eos_token_ids=(), return_logits=True)
            assert all(len(row) == NEW_TOKENS for row in out.tokens)
            ties = assert_same_greedy(
                {"ours": out.tokens, "transformers": hf_greedy(directory, ids, mask, NEW_TOKENS)}, out.logits
            )
            for tie in ties:
                print(f"{name}: {tie}")

    @pytest.mark.parametrize("name", SLIDING_FAMILIES)
    def test_cached_logits_equal_recomputed_logits(self, name, hf_checkpoint):
        """Generation's logits at every step equal the uncached forward over prompt + tokens so far."""
        model = load(self.backend, hf_checkpoint(name))
        prompt = np.random.default_rng(5).integers(1, FAMILY_CONFIGS[name]["vocab_size"], (2, PROMPT))
        out = package(self.backend).generate(model, prompt, NEW_TOKENS, eos_token_ids=(), return_logits=True)
        recomputed = run(model, np.concatenate([prompt, np.array(out.tokens)], axis=1))  # [B, 9 + 24, V]
        for step, logits in enumerate(out.logits):
            assert rel_err(logits, recomputed[:, PROMPT - 1 + step]) <= FP32_REL, step

    @pytest.mark.parametrize("chunk", [3, 7, 10])
    def test_multi_token_steps_through_the_ring(self, chunk, hf_checkpoint):
        """Steps of T > 1 tokens after the ring has wrapped (chunked prefill): T below, at and above Mistral's
        window of 7, where only the last C of a step's keys are kept."""
        model = load(self.backend, hf_checkpoint("mistral_window"))
        ids = np.random.default_rng(6).integers(1, FAMILY_CONFIGS["mistral_window"]["vocab_size"], (2, 30))
        assert rel_err(self.cached_logits(model, ids, chunk), run(model, ids)) <= FP32_REL
