"""jax_impl.from_pretrained's host memory (tests/twins/host_memory.py)."""

from __future__ import annotations

import numpy as np

import jax_impl
from tests.twins.host_memory import HostMemoryTwin


class TestHostMemoryTwin(HostMemoryTwin):
    def load(self, directory, dtype):
        return jax_impl.from_pretrained(directory, dtype)

    def embedding(self, model):
        weight = model.model.embed_tokens.weight[...]
        return weight.unsafe_buffer_pointer(), np.asarray(weight, np.float32)
