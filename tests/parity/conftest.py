"""Fixtures of the parity tests: checkpoints every test may use (the Triton interpreter is set in tests/conftest.py)."""

from __future__ import annotations

import dataclasses

import pytest


@pytest.fixture(scope="session")
def large_eps_dir(tmp_path_factory):
    """The default spec with rms_norm_eps = 0.1: large enough that where eps goes changes the output visibly."""
    import spec

    model_spec = dataclasses.replace(spec.DEFAULT_SPEC, rms_norm_eps=0.1)
    return spec.write_checkpoint(
        tmp_path_factory.mktemp("large_eps"), model_spec, spec.random_weights(model_spec, seed=1)
    )


@pytest.fixture(scope="session")
def checkpoints(default_dir, large_eps_dir):
    return {"default": default_dir, "large_eps": large_eps_dir}
