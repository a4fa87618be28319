"""Where the built-in default checkpoint is cached, and a clear CheckpointError naming the path when it cannot be
written: XDG_CACHE_HOME pointing at a file, a HOME that is a file, a read-only cache."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import spec.default
from spec import CheckpointError
from spec.default import default_cache_dir, default_checkpoint


def test_xdg_cache_home_pointing_at_a_file(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    with pytest.raises(CheckpointError) as err:
        default_checkpoint()
    message = str(err.value)
    assert f"cache directory {tmp_path / 'file' / 'decoder-parity'}" in message and "Not a directory" in message
    assert "XDG_CACHE_HOME" in message


def test_home_that_is_a_file_without_xdg(tmp_path, monkeypatch):
    (tmp_path / "home").write_text("x")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "decoder-parity"
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'home'}.*Not a directory"):
        default_checkpoint()


def test_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "decoder-parity"


def test_no_home_at_all(monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    with pytest.raises(CheckpointError, match="home directory is unknown"):
        default_cache_dir()


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_cache_that_cannot_be_written(tmp_path, monkeypatch, code):
    """A read-only file system, no permission, a full disk (simulated: root ignores permission bits)."""

    def failing_write(directory, *args, **kwargs):
        Path(directory).mkdir(parents=True, exist_ok=True)
        raise OSError(code, os.strerror(code), str(Path(directory) / "model.safetensors"))

    monkeypatch.setattr(spec.default, "write_checkpoint", failing_write)
    with pytest.raises(CheckpointError) as err:
        default_checkpoint(tmp_path / "cache")
    assert str(tmp_path / "cache") in str(err.value) and os.strerror(code) in str(err.value)
    assert not list((tmp_path / "cache").glob(".*tmp*"))  # the half-written copy is removed


def test_a_read_only_cache_that_already_holds_the_checkpoint_still_works(tmp_path, monkeypatch):
    first = default_checkpoint(tmp_path / "cache")

    def must_not_write(*args, **kwargs):
        raise AssertionError("the cached copy should be used as it is")

    monkeypatch.setattr(spec.default, "write_checkpoint", must_not_write)
    assert default_checkpoint(tmp_path / "cache") == first
