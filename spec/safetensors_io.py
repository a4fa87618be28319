"""Read and write the safetensors format with numpy + ml_dtypes, memory-mapped, framework-neutral.

The `safetensors` package's numpy front end cannot hold bfloat16, so the format (8-byte little-endian
header length, a JSON header of {name: {dtype, shape, data_offsets}} plus an optional `__metadata__`
string map, then the raw bytes) is parsed here and each tensor is a read-only view into one `np.memmap`
per file: nothing is copied until a backend converts it.

The header is checked as strictly as the format's reference implementation checks it, so a corrupt file
fails with the file's name and the problem instead of returning garbage: dims and offsets are JSON
integers (not floats, strings or booleans), dtypes are strings, names are unique, the metadata maps
strings to strings, element counts are computed in Python integers (no int64 wrap-around), nesting is
bounded before the JSON parser recurses, and the tensors tile the data section exactly (no overlap, no
gap, no trailing bytes) in whatever order the header lists them.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from spec.errors import CheckpointError
from spec.json_fields import is_int, parse_json

_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header
_MAX_DEPTH = 3  # the format nests no deeper: header object > tensor entry > shape list
_MAX_RANK = 64  # numpy's limit on dimensions: no array of higher rank can be made
_MAX_BYTES = 2**63 - 1  # offsets and sizes are int64 in numpy and in the reference implementation
_METADATA = "__metadata__"


class _Duplicate(Exception):
    """A key repeated inside one JSON object (raised from the parser hook, turned into a CheckpointError)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        raise _Duplicate(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def _size_int(text: str) -> int | float:
    """JSON integers as the format reads them, unsigned 64-bit: a negative one (even "-0") or one of more than
    20 digits cannot be a size or an offset, so it is kept as a float, which every size check refuses (and
    Python's quadratic parse of a 5,000-digit integer never runs)."""
    return int(text) if text[0] != "-" and len(text) <= 20 else float(text)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN / Infinity: Python's json reads them, the format does not


class SafetensorsFile:
    """One memory-mapped .safetensors file: header parsed and checked, tensors as zero-copy views."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(8)
                if len(head) < 8:
                    raise self._error(f"truncated ({size} bytes; not even a header length)")
                (n,) = struct.unpack("<Q", head)
                if n > _MAX_HEADER or 8 + n > size:
                    raise self._error(f"corrupt or truncated header (declares {n} header bytes, file has {size})")
                raw = f.read(n)
        except OSError as err:
            raise self._error(f"cannot read ({err.strerror or err})") from err
        self._size = size
        self._data_start = 8 + n
        header = self._parse(raw)
        self.metadata = self._check_metadata(header.pop(_METADATA, None))
        data_size = size - self._data_start
        self._info = {name: self._check_entry(name, info, data_size) for name, info in header.items()}
        self._check_tiling(data_size)
        self._map: np.memmap | None = None
        self._lock = threading.Lock()  # one map per file, even when threads read tensors concurrently

    def _error(self, message: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {message}")

    def _parse(self, raw: bytes) -> dict[str, Any]:
        try:
            header = parse_json(
                raw,
                CheckpointError,
                f"{self.path}: corrupt header",
                max_depth=_MAX_DEPTH,
                object_pairs_hook=_unique_keys,
                parse_constant=_refuse_constant,
                parse_int=_size_int,
            )
        except _Duplicate as err:
            raise self._error(f"corrupt header: the key {str(err)!r} appears twice in one object") from None
        if not isinstance(header, dict):
            raise self._error("corrupt header (not a JSON object)")
        for name in header:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate escape (\ud800): valid to Python, not UTF-8
                raise self._error(f"corrupt header: tensor name {name!r} is not valid Unicode") from None
        return header

    def _check_metadata(self, metadata: Any) -> dict[str, str]:
        if metadata is None:
            return {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise self._error(f"corrupt header: {_METADATA} must map strings to strings, got {_short(metadata)}")
        try:
            "".join(metadata).encode("utf-8"), "".join(metadata.values()).encode("utf-8")
        except UnicodeEncodeError:
            raise self._error(f"corrupt header: {_METADATA} holds a string that is not valid Unicode") from None
        return metadata

    def _check_entry(self, name: str, info: Any, data_size: int) -> tuple[np.dtype, tuple[int, ...], int, int]:
        def corrupt(what: str) -> CheckpointError:
            return self._error(f"corrupt header entry for tensor {name!r}: {what} (entry: {_short(info)})")

        if not isinstance(info, dict):
            raise corrupt("not an object")
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
        if missing:
            raise corrupt(f"lacks {', '.join(missing)}")
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(code, str):
            raise corrupt("dtype must be a string")
        if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
            raise corrupt("shape must be a list of JSON integers >= 0")
        if len(shape) > _MAX_RANK:
            raise corrupt(f"rank {len(shape)} exceeds {_MAX_RANK}, the most dimensions an array can have")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets):
            raise corrupt("data_offsets must be a list of two JSON integers")
        start, end = offsets
        if not 0 <= start <= end:
            raise corrupt(f"data_offsets [{start}, {end}] are not 0 <= begin <= end")
        if code not in _DTYPES:
            raise self._error(f"tensor {name!r} has dtype {code}; only F32, BF16 and F16 load")
        dtype = _DTYPES[code]
        count, extent = 1, dtype.itemsize
        for dim in shape:  # Python integers: a count past int64 is caught, not wrapped as np.prod would
            count *= dim
            extent *= max(dim, 1)  # numpy refuses a zero-size shape whose other dims overflow, too
        if extent > _MAX_BYTES:
            raise corrupt(f"shape {shape} overflows int64 (no array of that shape can exist)")
        expected = count * dtype.itemsize
        if end - start != expected:
            raise self._error(
                f"tensor {name!r} of shape {shape} {code} declares {end - start} bytes, needs {expected} "
                "(corrupt header)"
            )
        if end > data_size:
            raise self._error(
                f"truncated: tensor {name!r} ends at byte {end} of the data section, which holds only {data_size} "
                "bytes (or its offsets are corrupt)"
            )
        return dtype, tuple(shape), start, end

    def _check_tiling(self, data_size: int) -> None:
        """The tensors cover the data section exactly once: each begins where the previous one (by offset) ends."""
        position, previous = 0, None
        for start, end, name in sorted((start, end, name) for name, (_, _, start, end) in self._info.items()):
            if start < position:
                raise self._error(f"corrupt header: tensor {name!r} at bytes [{start}, {end}) overlaps {previous!r}")
            if start > position:
                raise self._error(
                    f"corrupt header: {start - position} unclaimed bytes before tensor {name!r} (gap at byte "
                    f"{position} of the data section)"
                )
            position, previous = end, name
        if position != data_size:
            raise self._error(
                f"corrupt header: {data_size - position} trailing bytes after the last tensor (the tensors "
                f"cover {position} of the data section's {data_size} bytes)"
            )

    def keys(self) -> list[str]:
        return list(self._info)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._info[name][1]

    def dtype(self, name: str) -> np.dtype:
        return self._info[name][0]

    def nbytes(self, name: str) -> int:
        _, _, start, end = self._info[name]
        return end - start

    def get(self, name: str) -> np.ndarray:
        """A read-only view of the tensor, backed by the memory map."""
        if name not in self._info:
            raise self._error(f"no tensor named {name!r}")
        with self._lock:
            if self._map is None:
                try:
                    mapped = np.memmap(self.path, dtype=np.uint8, mode="r")
                except (OSError, ValueError) as err:
                    raise self._error(f"cannot map the file ({err})") from err
                if mapped.size != self._size:  # changed on disk since the header was checked
                    raise self._error(f"changed on disk while open ({self._size} bytes, now {mapped.size})")
                self._map = mapped
        dtype, shape, start, end = self._info[name]
        offset = self._data_start + start
        return self._map[offset : offset + (end - start)].view(dtype).reshape(shape)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` to `path` atomically (a temporary file renamed into place: never half-written).

    `format: pt` in the metadata is what transformers expects of a checkpoint it loads into torch.
    """
    path = Path(path)
    header: dict[str, Any] = {_METADATA: {"format": "pt", **(metadata or {})}}
    offset = 0
    arrays = []
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        if array.dtype not in _CODES:
            raise CheckpointError(
                f"cannot write tensor {name!r}: dtype {array.dtype} (only float32, bfloat16, float16)"
            )
        header[name] = {
            "dtype": _CODES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
        arrays.append(array)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format pads the header to an 8-byte boundary
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for array in arrays:
            f.write(array.tobytes())
    os.replace(tmp, path)
