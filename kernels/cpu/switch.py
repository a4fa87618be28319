"""`Switch`: an on/off flag of the calling thread (its context), on for the length of a `with` block.

The CPU decode-step launchers (torch_decode_ops.py, jax_decode_ops.py) keep two each: whether the caller is in
generation's decode steps, and whether a side-by-side run turned the kernels off. Framework-neutral.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator


class Switch:
    """Off, except inside `on()` in this context (a thread, an asyncio task)."""

    def __init__(self, name: str):
        self._var = contextvars.ContextVar(name, default=False)

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        token = self._var.set(True)
        try:
            yield
        finally:
            self._var.reset(token)

    def get(self) -> bool:
        return self._var.get()
