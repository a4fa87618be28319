"""jax_impl's window-bounded KV cache: the behaviour both twins share (tests/twins/window_cache.py), with
JAX's cached forward (the cache returned by each step) and jax.eval_shape for sizes too large to allocate; then
what only JAX has to prove: the ring's write is static-shaped, so the decode step still compiles once."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_impl import KVCache
from jax_impl.model import attention_masks, default_positions
from spec import ModelSpec
from tests.backends import to_numpy
from tests.twins.window_cache import WindowCacheTwin

# every new program is lowered before XLA compiles it or the test run's persistent compilation cache serves it
# (tests/conftest.py), so counting lowerings counts new programs whichever of the two happens
LOWERING = "jaxpr_to_mlir_module_duration"


class TestWindowCacheTwin(WindowCacheTwin):
    backend = "jax"

    def create_cache(self, spec: ModelSpec, batch: int, max_len: int, *, abstract: bool = False) -> KVCache:
        if abstract:
            return jax.eval_shape(lambda: KVCache.create(spec, batch, max_len, jnp.bfloat16))
        return KVCache.create(spec, batch, max_len, jnp.bfloat16)

    def cached_logits(self, model, ids: np.ndarray, chunk: int) -> np.ndarray:
        b, s = ids.shape
        cache = KVCache.create(model.module_spec, b, s, jnp.float32)
        key_valid = jnp.ones((b, s), bool)
        out = []
        for start in range(0, s, chunk):
            step = jnp.asarray(ids[:, start : start + chunk], jnp.int32)  # [B, T]
            t = step.shape[1]
            masks = attention_masks(model.spec, key_valid, cache.length, t, cache)
            logits, cache = model.logits(step, default_positions(key_valid, cache.length, t), masks, cache)
            cache = cache.advance(t)
            out.append(to_numpy(logits))  # [B, T, V]
        cache.check()
        return np.concatenate(out, axis=1)  # [B, S, V]


def test_ring_write_keeps_the_last_window_slots():
    """A 5-token write into a 3-slot ring, then one more: each index holds the latest slot of its residue."""
    spec = ModelSpec.from_hf_config(
        dict(model_type="mistral", vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
             num_attention_heads=1, head_dim=8, sliding_window=3, max_position_embeddings=16,
             rms_norm_eps=1e-5, rope_theta=10_000.0, hidden_act="silu")
    )  # fmt: skip
    cache = KVCache.create(spec, 1, 10, jnp.float32)
    assert cache.key_slots(5).tolist() == [-1, -1, -1, 0, 1, 2, 3, 4]
    slot_values = jnp.broadcast_to(jnp.arange(5.0)[None, None, :, None], (1, 1, 5, 8))  # key of slot s: all s
    cache, k, _ = cache.update(0, slot_values, slot_values.transpose(0, 1, 3, 2))
    assert k.shape == (1, 1, 3 + 5, 8)
    cache = cache.advance(5)
    assert cache.k[0][0, 0, :, 0].tolist() == [3.0, 4.0, 2.0]  # slots 3, 4, 2 at index s % 3
    assert cache.key_slots(1).tolist() == [3, 4, 2, 5]


def test_sliding_decode_step_compiles_once(hf_checkpoint):
    """Counts programs lowered for XLA (jax.monitoring): none after the first decode step, as without a ring."""
    import jax_impl

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _seconds, **_kw: compiles.append(event) if event.endswith(LOWERING) else None
    )
    model = jax_impl.from_pretrained(hf_checkpoint("mistral_window"))
    at_step = []
    jax_impl.generate(model, [[1, 2, 3]], 16, eos_token_ids=(), stream=lambda step, _t: at_step.append(len(compiles)))
    assert at_step[-1] == at_step[2], f"compilations during decoding: {at_step}"
