"""JSON files and values read with types: every refusal names the file or key and the value it got.

Python's `json` is permissive where a config must not be: it reads `NaN` and `Infinity`, `true` is an
int (`True + 1 == 2`), and a string `"false"` is truthy. `Fields` reads one JSON object key by key, each
read stating a type and a range, so `"tie_word_embeddings": "false"` or `"rms_norm_eps": true` is refused
with the key and the value instead of being taken as true or 1.0. `load_json` reads a file as strict
UTF-8 and refuses nesting deeper than a bound before the parser recurses (a header nested 100,000 deep
would otherwise end in a RecursionError).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from spec.errors import DecoderParityError

MAX_DEPTH = 64  # nesting allowed in config/index files: Hugging Face configs nest 3-4 deep
MAX_SIZE = 2**31 - 1  # bound on sizes: ids and positions are int32 in jax_impl, so nothing larger can run
REQUIRED = object()  # default of a key that must be present (and not null)

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN, _CLOSE = (ord("["), ord("{")), (ord("]"), ord("}"))


def json_depth(raw: bytes, limit: int) -> int:
    """The nesting depth of the JSON text `raw` (strings skipped), counted up to just past `limit`.

    Vectorized over the bracket bytes, so a 100 MB header costs a few passes, not a Python loop per byte.
    """
    stripped = _STRING.sub(b'""', raw)
    data = np.frombuffer(stripped, np.uint8)
    depth, deepest = 0, 0
    for start in range(0, data.size, 1 << 22):  # 4 MB blocks: temporaries stay small
        block = data[start : start + (1 << 22)]
        step = np.isin(block, _OPEN).astype(np.int32) - np.isin(block, _CLOSE).astype(np.int32)
        running = np.cumsum(step[step != 0]) + depth
        if running.size:
            deepest = max(deepest, int(running.max()))
            depth = int(running[-1])
        if deepest > limit:
            break
    return deepest


def load_json(path: Path, error: type[DecoderParityError], *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse the JSON file `path`, raising `error` (naming the file) for unreadable, non-UTF-8 or invalid text."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise error(f"cannot read {path}: {err.strerror or err}") from err
    return parse_json(raw, error, str(path), max_depth=max_depth)


def parse_json(raw: bytes, error: type[DecoderParityError], where: str, *, max_depth: int = MAX_DEPTH, **kw) -> Any:
    """`json.loads` of strict UTF-8 `raw` with bounded nesting; `kw` goes to json.loads (hooks)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{where} is not UTF-8 text (invalid byte {raw[err.start]:#04x} at offset {err.start})") from err
    depth = json_depth(raw, max_depth)
    if depth > max_depth:
        raise error(f"{where}: JSON nested more than {max_depth} levels deep (refused before parsing)")
    try:
        return json.loads(text, **kw)
    except RecursionError as err:  # unreachable after the depth check; kept so no parser path escapes
        raise error(f"{where}: JSON nested too deeply") from err
    except ValueError as err:  # JSONDecodeError, and int() past Python's digit limit
        raise error(f"{where} is not valid JSON: {err}") from err


def is_int(value: Any) -> bool:
    """A JSON integer: an int that is not a bool (JSON `true` parses to Python True, an int subclass)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite JSON number: int or float, not a bool, not NaN or +-Infinity."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


class Fields:
    """One JSON object read key by key with a type and range per key; null counts as absent.

    `prefix` is prepended to key names in messages (e.g. "rope_scaling." for a nested object), `noun` names
    what the keys are ("config key").
    """

    def __init__(self, obj: Any, error: type[DecoderParityError], *, prefix: str = "", noun: str = "config key"):
        self.error, self.prefix, self.noun = error, prefix, noun
        if not isinstance(obj, dict):
            what = f"{noun} {prefix.rstrip('.')!r}" if prefix else "the config"
            raise error(f"{what} must be a JSON object, got {_show(obj)}")
        self.obj = obj

    def fail(self, key: str, expected: str, value: Any) -> DecoderParityError:
        return self.error(f"{self.noun} {self.prefix + key!r} must be {expected}, got {_show(value)}")

    def value(self, key: str) -> Any:
        """The value at `key` untyped (None when absent or null), for checks that accept several types."""
        return self.obj.get(key)

    def _get(self, key: str, default: Any = REQUIRED) -> Any:
        """The value at `key` as parsed; `default` when absent or null (a ConfigError if it is REQUIRED)."""
        value = self.obj.get(key)
        if value is None:
            if default is REQUIRED:
                raise self.error(f"{self.noun} {self.prefix + key!r} is required but missing (or null)")
            return _Default(default)
        return value

    def integer(self, key: str, default: Any = REQUIRED, *, minimum: int = 1, maximum: int = MAX_SIZE) -> Any:
        value = self._get(key, default)
        if isinstance(value, _Default):
            return value.value
        if not is_int(value) or not minimum <= value <= maximum:
            raise self.fail(key, f"an integer in [{minimum}, {maximum}]", value)
        return value

    def number(self, key: str, default: Any = REQUIRED, *, positive: bool = True) -> Any:
        value = self._get(key, default)
        if isinstance(value, _Default):
            return value.value
        if not is_number(value) or (positive and value <= 0):
            raise self.fail(key, "a finite number" + (" > 0" if positive else ""), value)
        return float(value)

    def boolean(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._get(key, default)
        if isinstance(value, _Default):
            return value.value
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def string(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._get(key, default)
        if isinstance(value, _Default):
            return value.value
        if not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value

    def strings(self, key: str) -> list[str] | None:
        value = self._get(key, None)
        if isinstance(value, _Default):
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "a list of strings", value)
        return value

    def integers(self, key: str, *, minimum: int = 0, maximum: int = MAX_SIZE) -> list[int] | None:
        value = self._get(key, None)
        if isinstance(value, _Default):
            return None
        if not isinstance(value, list) or not all(is_int(v) and minimum <= v <= maximum for v in value):
            raise self.fail(key, f"a list of integers in [{minimum}, {maximum}]", value)
        return value

    def nested(self, key: str) -> Fields | None:
        value = self._get(key, None)
        if isinstance(value, _Default):
            return None
        return Fields(value, self.error, prefix=f"{self.prefix}{key}.", noun=self.noun)


class _Default:
    """Marks a default returned by `Fields._get`, so a present value equal to the default is still checked."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def _show(value: Any) -> str:
    """A value for a message: JSON spelling (true, null, "abc"), cut short so a huge value stays readable."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
