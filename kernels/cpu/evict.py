"""Taking a timing pass's operands out of the processor's caches (kernels/cpu/evict.c), so that the pass reads them
from memory as a decode step does: `evicting(buffers)` is the untimed step spec/path_choice.py's `Pass` runs before
each timed pass.

A decode step streams more weights than the last-level cache holds; a timing pass of a few tens of MB does not, and on
a processor whose last-level cache is larger than the pass it found its weights there, where the libraries' products
ranked otherwise than from memory (docs/benchmarks.md). Framework-neutral: a buffer is (address, bytes), which the
backends take from their arrays (torch's `data_ptr()`, JAX's `unsafe_buffer_pointer()`).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterable

from kernels.cpu import build


@functools.cache
def _evict() -> ctypes._CFuncPtr | None:
    table = build.functions("evict", {"evict": ("evict", [ctypes.c_void_p, ctypes.c_long])})
    return None if table is None else table["evict"]


def available() -> bool:
    """Whether eviction runs here (kernels.cpu.build.unavailable("evict") says why not)."""
    return _evict() is not None


def evicting(buffers: Iterable[tuple[int, int]]) -> Callable[[], None] | None:
    """A call that takes every line of `buffers` ((address, bytes) pairs) out of every cache level, or None where
    eviction does not run here (the caller's passes then time whatever the caches hold). The memory is left as it
    is."""
    fn = _evict()
    if fn is None:
        return None
    spans = []
    for address, nbytes in buffers:
        if not (isinstance(address, int) and address > 0 and isinstance(nbytes, int) and nbytes >= 0):
            raise ValueError(f"evict: a buffer is (address > 0, bytes >= 0) as ints, got ({address!r}, {nbytes!r})")
        spans.append((ctypes.c_void_p(address), ctypes.c_long(nbytes)))

    def run() -> None:
        for address, nbytes in spans:
            fn(address, nbytes)

    return run
