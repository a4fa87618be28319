"""Shared fixtures: the built-in default checkpoint and transformers-written checkpoints, once a session."""

from __future__ import annotations

import pytest


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
