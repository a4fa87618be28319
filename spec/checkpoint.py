"""Checkpoint directories in Hugging Face layout: read (single file or sharded), pack, write.

A checkpoint directory holds `config.json` and either `model.safetensors` or
`model.safetensors.index.json` with its shards. Pickled weights (`*.bin`, `*.pt`, `*.pth`) are refused:
unpickling can execute code. `runtime_params` walks the parameter table, validates, packs (gate and up
merged, gate first) and yields numpy arrays that the backends convert; it is the only loader logic
the two backends share, so neither carries checkpoint names of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from spec.config import ModelSpec
from spec.errors import CheckpointError
from spec.parallel import ShardLayout, shard_of
from spec.params import ParamEntry, param_table, runtime_groups
from spec.progress import Progress
from spec.safetensors_io import SafetensorsFile, write_safetensors

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class Checkpoint:
    """The tensors of one checkpoint directory, by name, across shards, memory-mapped."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise CheckpointError(f"checkpoint directory {self.directory} does not exist")
        self._files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, SafetensorsFile] = {}
        index_path, single_path = self.directory / INDEX, self.directory / SINGLE
        if index_path.is_file():
            self._open_index(index_path)
        elif single_path.is_file():
            file = SafetensorsFile(single_path)
            self._files[SINGLE] = file
            self._where = dict.fromkeys(file.keys(), file)
        else:
            pickles = sorted(p.name for p in self.directory.iterdir() if p.suffix in _PICKLE_SUFFIXES)
            if pickles:
                raise CheckpointError(
                    f"{self.directory} holds only pickled weights ({', '.join(pickles)}): they "
                    "are refused because unpickling can execute arbitrary code; convert them to "
                    "safetensors (e.g. save_pretrained(..., safe_serialization=True))"
                )
            raise CheckpointError(f"{self.directory} has no {SINGLE} and no {INDEX}")

    def _open_index(self, index_path: Path) -> None:
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointError(f"{index_path}: not a valid safetensors index ({err!r})") from err
        for name, shard in weight_map.items():
            if shard not in self._files:
                shard_path = self.directory / shard
                if not shard_path.is_file():
                    raise CheckpointError(f"{index_path} maps {name!r} to shard {shard!r}, which is missing")
                self._files[shard] = SafetensorsFile(shard_path)
            file = self._files[shard]
            if name not in file.keys():
                raise CheckpointError(f"{index_path} maps {name!r} to {shard}, which does not hold it")
            self._where[name] = file

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple[int, ...]:
        return self._where[name].shape(name)

    def nbytes(self, name: str) -> int:
        return self._where[name].nbytes(name)

    def get(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise CheckpointError(f"{self.directory}: no tensor named {name!r}")
        return self._where[name].get(name)


def runtime_params(
    checkpoint: Checkpoint,
    spec: ModelSpec,
    dtype: np.dtype | None = None,
    *,
    progress: bool = False,
    layout: ShardLayout | None = None,
) -> Iterator[tuple[str, str, str, np.ndarray]]:
    """Yield (module, role, kind, array) for every runtime parameter, packed (and cast to `dtype` if given).

    The checkpoint is validated first (all problems in one error). Arrays are in torch layout; a Flax
    loader transposes LINEAR kinds. Casting happens here, one tensor at a time, so peak host memory
    stays near one tensor beyond the model itself. With a tensor-parallel `layout`, each array is that
    rank's slice (spec/parallel.py), cut from the memory map before anything is read.
    """
    from spec.validate import validate_checkpoint  # validate imports this module

    validate_checkpoint(checkpoint, spec)
    groups = runtime_groups(spec)
    total_bytes = sum(checkpoint.nbytes(e.name) for entries in groups.values() for e in entries)
    bar = Progress(total_bytes, f"loading {checkpoint.directory.name}", enabled=progress, unit="B")
    for (module, role), entries in groups.items():
        arrays = [_cast(shard_of(checkpoint.get(e.name), e, layout), dtype) for e in entries]
        array = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)  # [parts * out, in]
        bar.update(sum(checkpoint.nbytes(e.name) for e in entries))
        yield module, role, entries[0].kind, array
    bar.close()


def _cast(array: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    return array if dtype is None or array.dtype == dtype else array.astype(dtype)


def write_checkpoint(
    directory: str | Path,
    spec: ModelSpec,
    tensors: dict[str, np.ndarray],
    *,
    max_shard_bytes: int | None = None,
    extra_config: dict | None = None,
) -> Path:
    """Write a Hugging Face-layout checkpoint (config.json + safetensors) that transformers can load.

    `tensors` are keyed by checkpoint name (see `param_table`) in torch layout. With `max_shard_bytes`
    the tensors are split across `model-0000k-of-0000n.safetensors` with an index file.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    expected = {e.name: e for e in param_table(spec)}
    _check_tensors(tensors, expected)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for entry in param_table(spec):
        array = tensors[entry.name]
        if max_shard_bytes is not None and shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][entry.name] = array
        size += array.nbytes
    if len(shards) == 1 and max_shard_bytes is None:
        write_safetensors(directory / SINGLE, shards[0])
    else:
        weight_map = {}
        for k, shard in enumerate(shards, start=1):
            fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(directory / fname, shard)
            weight_map.update(dict.fromkeys(shard, fname))
        total = sum(a.nbytes for a in tensors.values())
        _write_json(directory / INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map})
    dtypes = {str(a.dtype) for a in tensors.values()}
    config = spec.to_hf_config()
    config["torch_dtype"] = dtypes.pop() if len(dtypes) == 1 else "float32"
    config.update(extra_config or {})
    _write_json(directory / "config.json", config)
    return directory


def _check_tensors(tensors: dict[str, np.ndarray], expected: dict[str, ParamEntry]) -> None:
    problems = [f"missing tensor {n!r}" for n in expected if n not in tensors]
    problems += [f"unexpected tensor {n!r}" for n in tensors if n not in expected]
    problems += [
        f"tensor {n!r} has shape {list(a.shape)}, the spec says {list(expected[n].shape)}"
        for n, a in tensors.items()
        if n in expected and tuple(a.shape) != expected[n].shape
    ]
    if problems:
        raise CheckpointError("cannot write checkpoint:\n  " + "\n  ".join(problems))


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)
