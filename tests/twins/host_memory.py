"""Both loaders place a checkpoint's large weights on 2 MiB pages where the machine gives them (spec/host_memory.py),
with the checkpoint's values; each backend's test module runs these (tests/*/test_loader.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spec import DEFAULT_SPEC, host_memory, write_checkpoint
from spec.default import random_weights

# The default spec with a vocabulary whose embedding is over 2 MiB in float32 and in bfloat16 (4099 x 256 x 2 bytes),
# of an odd row count; every other weight stays small.
SPEC = dataclasses.replace(DEFAULT_SPEC, vocab_size=4099, hidden_size=256, intermediate_size=96, head_dim=32)
EMBED = "model.embed_tokens.weight"


class HostMemoryTwin:
    """Subclasses give `load(directory, dtype)` -> model and `embedding(model)` -> (address, float32 values)."""

    @pytest.fixture(scope="class")
    def checkpoint(self, tmp_path_factory):
        directory = tmp_path_factory.mktemp("huge")
        tensors = random_weights(SPEC, seed=3)
        write_checkpoint(directory, SPEC, tensors)
        return directory, tensors

    @pytest.mark.skipif(not host_memory.available(), reason="no transparent huge pages to ask for here")
    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    def test_a_large_weight_sits_on_huge_pages_with_the_checkpoints_values(self, checkpoint, dtype):
        directory, tensors = checkpoint
        address, values = self.embedding(self.load(directory, dtype))
        assert address % host_memory.HUGE == 0
        want = tensors[EMBED].astype(np.float32)
        if dtype == "bfloat16":
            import ml_dtypes

            want = want.astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(values, want)
