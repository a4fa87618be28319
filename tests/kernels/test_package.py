"""kernels/__init__.py: what this package says where another `kernels` is installed beside it."""

from __future__ import annotations

import pytest


def test_a_name_of_hugging_faces_kernels_says_which_package_shadows_which(monkeypatch):
    """transformers 5.25+ imports Hugging Face's `kernels` (same import name as this package): where that
    distribution is installed, a name only it has gets an error that names the clash and the fix."""
    import importlib.metadata

    import kernels

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.19.1")
    with pytest.raises(ImportError, match=r"shadows Hugging Face's `kernels` 0\.19\.1.*transformers<5\.25"):
        from kernels import CUDAProperties  # noqa: F401
    assert not hasattr(kernels, "__wrapped__")  # dunder probes (inspect, pytest) still see a plain AttributeError
    with pytest.raises(AttributeError):  # a submodule not imported yet: `from kernels import cpu` then imports it
        kernels.__getattr__("cpu")

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(AttributeError, match="has no attribute 'CUDAProperties'"):
        kernels.CUDAProperties  # noqa: B018
