"""Read and write the safetensors format with numpy + ml_dtypes, memory-mapped, framework-neutral.

The `safetensors` package's numpy front end cannot hold bfloat16, so the format (8-byte little-endian
header length, a JSON header of {name: {dtype, shape, data_offsets}}, then the raw bytes) is parsed
here and each tensor is a read-only view into one `np.memmap` per file: nothing is copied until a
backend converts it. Every header is checked against the file size, so a truncated or corrupt file
fails with the file's name instead of returning garbage.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from spec.errors import CheckpointError

_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header


class SafetensorsFile:
    """One memory-mapped .safetensors file: header parsed and checked, tensors as zero-copy views."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise CheckpointError(f"{self.path}: truncated ({size} bytes; not even a header length)")
                (n,) = struct.unpack("<Q", head)
                if n > _MAX_HEADER or 8 + n > size:
                    raise CheckpointError(
                        f"{self.path}: corrupt or truncated header (declares {n} header bytes, file has {size})"
                    )
                header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{self.path}: corrupt header, not valid JSON ({err})") from err
        except OSError as err:
            raise CheckpointError(f"{self.path}: cannot read ({err})") from err
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: corrupt header (not a JSON object)")
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._data_start = 8 + n
        self._info: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            self._info[name] = self._check_entry(name, info, size - self._data_start)
        self._map: np.memmap | None = None

    def _check_entry(self, name: str, info: Any, data_size: int) -> tuple[np.dtype, tuple[int, ...], int, int]:
        try:
            code, shape, (start, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{self.path}: corrupt header entry for tensor {name!r}: {info!r}") from err
        if code not in _DTYPES:
            raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {code}; only F32, BF16 and F16 load")
        dtype = _DTYPES[code]
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not (0 <= start <= end) or end - start != expected:
            raise CheckpointError(
                f"{self.path}: tensor {name!r} of shape {list(shape)} {code} declares "
                f"{end - start} bytes, needs {expected} (corrupt header)"
            )
        if end > data_size:
            raise CheckpointError(
                f"{self.path}: truncated: tensor {name!r} ends at byte {end} of the data "
                f"section, which holds only {data_size} bytes"
            )
        return dtype, shape, start, end

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
            raise CheckpointError(f"{self.path}: no tensor named {name!r}")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        dtype, shape, start, end = self._info[name]
        offset = self._data_start + start
        return self._map[offset : offset + (end - start)].view(dtype).reshape(shape)


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` to `path` atomically (a temporary file renamed into place: never half-written).

    `format: pt` in the metadata is what transformers expects of a checkpoint it loads into torch.
    """
    path = Path(path)
    header: dict[str, Any] = {"__metadata__": {"format": "pt", **(metadata or {})}}
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
