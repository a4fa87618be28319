"""torch_impl's window-bounded KV cache: the behaviour both twins share (tests/twins/window_cache.py), with
torch's cached forward (the cache updated in place) and its meta device for sizes too large to allocate."""

from __future__ import annotations

import numpy as np
import torch

from spec import ModelSpec
from tests.backends import to_numpy
from tests.twins.window_cache import WindowCacheTwin
from torch_impl import KVCache


class TestWindowCacheTwin(WindowCacheTwin):
    backend = "torch"

    def create_cache(self, spec: ModelSpec, batch: int, max_len: int, *, abstract: bool = False) -> KVCache:
        return KVCache.create(spec, batch, max_len, torch.bfloat16, device="meta" if abstract else "cpu")

    def cached_logits(self, model, ids: np.ndarray, chunk: int) -> np.ndarray:
        b, s = ids.shape
        cache = KVCache.create(model.module_spec, b, s, torch.float32)
        out = []
        with torch.inference_mode():
            for start in range(0, s, chunk):
                end = min(start + chunk, s)
                out.append(model(ids[:, start:end], attention_mask=np.ones((b, end), int), cache=cache))  # [B, T, V]
        return to_numpy(torch.cat(out, dim=1))  # [B, S, V]


def test_ring_write_keeps_the_last_window_slots():
    """A 5-token write into a 3-slot ring, then one more: each index holds the latest slot of its residue."""
    spec = ModelSpec.from_hf_config(
        dict(model_type="mistral", vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
             num_attention_heads=1, head_dim=8, sliding_window=3, max_position_embeddings=16,
             rms_norm_eps=1e-5, rope_theta=10_000.0, hidden_act="silu")
    )  # fmt: skip
    cache = KVCache.create(spec, 1, 10, torch.float32)
    assert cache.key_slots(5).tolist() == [-1, -1, -1, 0, 1, 2, 3, 4]
    slot_values = torch.arange(5.0)[None, None, :, None].expand(1, 1, 5, 8)  # key of slot s: all s
    k, _ = cache.update(0, slot_values, slot_values.transpose(2, 3))
    assert k.shape == (1, 1, 3 + 5, 8)
    cache.advance(5)
    assert cache.k[0][0, 0, :, 0].tolist() == [3.0, 4.0, 2.0]  # slots 3, 4, 2 at index s % 3
    assert cache.key_slots(1).tolist() == [3, 4, 2, 5]
