"""Host memory for a model's large weights on 2 MiB pages, where the operating system gives them: `empty(nbytes)`.

A CPU decode step reads every weight once from memory. On 4 KiB pages that read crosses a page, and may miss the
processor's address-translation cache, every 4 KiB; on Linux's transparent huge pages it crosses one every 2 MiB.
Both loaders (torch_impl/loader.py, jax_impl/loader.py) place each weight of at least `HUGE` bytes in such memory
before writing it, so the first write faults 2 MiB pages in (docs/benchmarks.md has what it changed, and on which
machine). Where Linux runs transparent huge pages only on request (`enabled` = madvise, the common default) the
request is madvise(MADV_HUGEPAGE) on the mapping; where they are off, or on another system, the memory is plain
pages and everything else is the same. Framework-neutral: numpy only.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

HUGE = 2 << 20  # the x86-64 huge page: a weight smaller than this stays in the framework's own allocation
_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    """Linux's transparent huge page setting ("always", "madvise", "never"), or None where there is none to read."""
    try:
        text = _SETTING.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def available() -> bool:
    """Whether `empty` asks for huge pages here: Linux with the setting not "never", and madvise's flag known."""
    return hasattr(mmap, "MADV_HUGEPAGE") and thp_mode() in ("always", "madvise")


def empty(nbytes: int) -> np.ndarray:
    """An uninitialized uint8 [nbytes] buffer starting on a 2 MiB boundary, asked for on huge pages (`available`);
    np.empty's where they are not. Its memory is freed with the last array viewing it."""
    if not (isinstance(nbytes, int) and nbytes >= 0):
        raise ValueError(f"host_memory.empty: nbytes must be an int >= 0, got {nbytes!r}")
    if not available() or nbytes < HUGE:
        return np.empty(nbytes, np.uint8)
    # One extra huge page of address space to start on a boundary: never written, so never given memory.
    region = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    whole = np.frombuffer(region, np.uint8)  # keeps the mapping alive
    skip = -whole.ctypes.data % HUGE
    return whole[skip : skip + nbytes]


def empty_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """`empty` viewed as an uninitialized C-contiguous array of `shape` and `dtype` (ml_dtypes' bfloat16 included)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return empty(count * dtype.itemsize).view(dtype).reshape(shape)
