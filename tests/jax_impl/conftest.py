"""Fixtures shared by jax_impl's tests."""

from __future__ import annotations

import pytest

from jax_impl.linear import PATHS


@pytest.fixture
def fresh_choices():
    """An empty record of choices for the test, the process's own restored afterwards."""
    saved, charged = PATHS.chosen(), PATHS._charged
    PATHS.clear()
    yield PATHS
    PATHS.clear()
    PATHS._chosen.update(saved)
    PATHS._charged = charged
