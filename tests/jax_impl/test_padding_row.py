"""jax_impl's embedding padding row: the behaviour both twins share (tests/twins/padding_row.py), then the
vocabulary-parallel gather on two simulated devices (a subprocess: the device count is fixed before JAX starts):
its gradient equals the unsharded gather's with the pad row on either shard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.twins.padding_row import PaddingRowTwin


class TestPaddingRowTwin(PaddingRowTwin):
    backend = "jax"


# The gather alone (no model: one small program to compile), table V = 11 padded to 12, rows 0-5 and 6-11.
TP_GATHER = """
import jax
jax.config.update("jax_num_cpu_devices", 2)
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from jax_impl.embedding import Embedding
from jax_impl.tensor_parallel import make_mesh
from flax import nnx

table = np.random.default_rng(0).standard_normal((12, 5)).astype(np.float32)
table[11] = 0  # the padding row of the vocabulary (V = 11)
ids = np.array([[3, 1, 9, 3, 0], [7, 3, 10, 9, 9]])
cotangent = np.random.default_rng(1).standard_normal((2, 5, 5)).astype(np.float32)
mesh = make_mesh(2)
for pad in (3, 9, None):  # on shard 0, on shard 1, none
    grads = []
    for tp in (1, 2):
        emb = Embedding(12, 5, dtype=jnp.float32, tp=tp, pad_token_id=pad, rngs=nnx.Rngs(0))
        weight = jnp.asarray(table)
        if tp > 1:
            weight = jax.device_put(weight, NamedSharding(mesh, P("model", None)))
        emb.weight[...] = weight
        with jax.set_mesh(mesh):
            grad = nnx.grad(lambda m: jnp.sum(m(jnp.asarray(ids)) * cotangent))(emb)
        grads.append(np.asarray(grad["weight"][...]))
    np.testing.assert_allclose(grads[1], grads[0], rtol=0, atol=1e-6)
    if pad is not None:
        assert not grads[1][pad].any() and np.abs(grads[1][[1, 7, 10]]).min(axis=-1).all(), pad
    else:
        assert np.abs(grads[1][[1, 3, 7, 9, 10]]).min(axis=-1).all()
print("ok")
"""


def test_vocab_parallel_gather_gradient_equals_unsharded_with_pad_ids():
    result = subprocess.run(
        [sys.executable, "-c", TP_GATHER], capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2]
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-4000:]
