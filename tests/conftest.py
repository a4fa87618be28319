"""Shared fixtures (the built-in default checkpoint, transformers-written checkpoints) and kernel mode.

Without a GPU the fused Triton kernels run in interpret mode. Triton reads TRITON_INTERPRET when a kernel
is decorated, i.e. when kernels.triton.rms_norm is first imported, so it is set here, before any test
module imports it. setdefault: an explicit TRITON_INTERPRET=0/1 from the user wins. Pallas needs nothing:
it decides per call from the input's device.
"""

from __future__ import annotations

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def default_dir(tmp_path_factory):
    import spec

    return spec.default_checkpoint(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """hf_checkpoint(name) -> directory written by transformers' save_pretrained (cached per session)."""
    from tests.hf_models import save_hf_checkpoint

    made: dict[str, object] = {}

    def make(name: str):
        if name not in made:
            made[name] = save_hf_checkpoint(name, tmp_path_factory.mktemp(name))
        return made[name]

    return make
