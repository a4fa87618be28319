"""torch_impl.from_pretrained's host memory (tests/twins/host_memory.py)."""

from __future__ import annotations

import torch

import torch_impl
from tests.twins.host_memory import HostMemoryTwin


class TestHostMemoryTwin(HostMemoryTwin):
    def load(self, directory, dtype):
        return torch_impl.from_pretrained(directory, dtype)

    def embedding(self, model):
        weight = model.model.embed_tokens.weight
        assert model.lm_head.weight is weight  # still tied: one parameter, moved once
        return weight.data_ptr(), weight.to(torch.float32).numpy()
