"""kernels/cpu/evict.py (evict.c): taking a timing pass's operands out of the caches leaves their memory as it was,
whatever the alignment and length, in both frameworks' arrays; a bad buffer is refused by name. (That the lines leave
the caches is what docs/benchmarks.md measures: a pass after it reads at memory's rate, not the cache's.)"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from kernels.cpu import build, evict

pytestmark = pytest.mark.skipif(
    build._unsupported("evict") is not None, reason=f"no CPU kernels here: {build._unsupported('evict')}"
)


def test_evicting_leaves_torch_memory_unchanged_at_any_alignment_and_length():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3 * 4099 + 5, generator=gen)  # not a whole number of lines
    want = x.clone()
    start = x.data_ptr() + 4 * 3  # inside a line: the line it starts in is evicted whole
    run = evict.evicting([(start, 4 * 4099 + 2), (x.data_ptr(), 0), (x.data_ptr(), x.numel() * 4)])
    assert run is not None
    run()
    run()  # and again: nothing is written
    assert torch.equal(x, want)


def test_evicting_leaves_jax_memory_unchanged():
    a = jnp.arange(10_007, dtype=jnp.float32) * 0.5
    want = np.asarray(a).copy()
    evict.evicting([(a.unsafe_buffer_pointer(), a.nbytes)])()
    np.testing.assert_array_equal(np.asarray(a), want)


@pytest.mark.parametrize("buffer", [(0, 64), (-8, 64), (4096, -1), (4096.0, 64), (4096, 64.0), (None, 64)])
def test_a_bad_buffer_is_refused_by_name(buffer):
    with pytest.raises(ValueError, match=r"a buffer is \(address > 0, bytes >= 0\) as ints, got"):
        evict.evicting([buffer])
