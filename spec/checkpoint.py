"""Checkpoint directories in Hugging Face layout: read (single file or sharded), pack, write.

A checkpoint directory holds `config.json` and either `model.safetensors` or
`model.safetensors.index.json` with its shards. Pickled weights (`*.bin`, `*.pt`, `*.pth`) are refused:
unpickling can execute code. `runtime_params` walks the parameter table, validates, packs (gate and up
merged, gate first) and yields numpy arrays that the backends convert; it is the only loader logic
the two backends share, so neither carries checkpoint names of its own.

The shard names in an index are plain file names in the checkpoint directory: a name with a directory
part (`../x`, `/etc/passwd`) is refused, so an index cannot make the loader open a file elsewhere. The shard
files themselves may be symlinks (the Hugging Face cache links each snapshot's files to its blobs).
Every tensor is scanned for NaN/Inf as it is read (spec/validate.py), unless non-finite weights are
allowed, for debugging a broken export: `runtime_params(..., allow_nonfinite=True)`, or for everything
loaded inside `with allow_nonfinite_weights():` (how the CLI's --allow-nonfinite reaches the loaders).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from spec.config import ModelSpec
from spec.errors import CheckpointError, format_problems
from spec.json_fields import load_json
from spec.parallel import ShardLayout, shard_of
from spec.params import ParamEntry, param_table, runtime_groups
from spec.progress import Progress
from spec.safetensors_io import SafetensorsFile, write_safetensors
from spec.validate import check_finite, validate_checkpoint

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_ALLOW_NONFINITE = contextvars.ContextVar("allow_nonfinite", default=False)


@contextlib.contextmanager
def allow_nonfinite_weights(allow: bool = True) -> Iterator[None]:
    """Within this block, `runtime_params` (hence both loaders) loads tensors holding NaN/Inf (or, with
    allow=False, refuses them again). For debugging a broken export; scoped, never process-wide."""
    token = _ALLOW_NONFINITE.set(allow)
    try:
        yield
    finally:
        _ALLOW_NONFINITE.reset(token)


def nonfinite_weights_allowed() -> bool:
    """The setting `allow_nonfinite_weights` gives here: what a launcher hands to the processes it spawns."""
    return _ALLOW_NONFINITE.get()


class Checkpoint:
    """The tensors of one checkpoint directory, by name, across shards, memory-mapped."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            what = "is a file, not the checkpoint's directory" if self.directory.exists() else "does not exist"
            raise CheckpointError(f"checkpoint directory {self.directory} {what}")
        self._files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, SafetensorsFile] = {}
        self._validated: ModelSpec | None = None
        index_path, single_path = self.directory / INDEX, self.directory / SINGLE
        if index_path.is_file():
            self._open_index(index_path)
        elif single_path.is_file():
            file = SafetensorsFile(single_path)
            self._files[SINGLE] = file
            self._where = dict.fromkeys(file.keys(), file)
        else:
            try:
                pickles = sorted(p.name for p in self.directory.iterdir() if p.suffix in _PICKLE_SUFFIXES)
            except OSError as err:
                raise CheckpointError(f"cannot list {self.directory}: {err.strerror or err}") from err
            if pickles:
                raise CheckpointError(
                    f"{self.directory} holds only pickled weights ({', '.join(pickles)}): they "
                    "are refused because unpickling can execute arbitrary code; convert them to "
                    "safetensors (e.g. save_pretrained(..., safe_serialization=True))"
                )
            raise CheckpointError(f"{self.directory} has no {SINGLE} and no {INDEX}")

    def _open_index(self, index_path: Path) -> None:
        index = load_json(index_path, CheckpointError)
        weight_map = index.get("weight_map") if isinstance(index, dict) else index
        if not isinstance(weight_map, dict):
            raise CheckpointError(
                f'{index_path}: not a valid safetensors index: needs a "weight_map" object mapping tensor names '
                f"to shard file names, got {json.dumps(weight_map)[:80]}"
            )
        bad = [f"{n!r} -> {json.dumps(s)[:80]}" for n, s in weight_map.items() if not _plain_file_name(s)]
        if bad:
            raise CheckpointError(
                f"{index_path}: shard names must be strings naming files directly in the checkpoint directory "
                "(no directory part, no '..', not absolute):" + format_problems(bad)
            )
        for name, shard in weight_map.items():
            if shard not in self._files:
                shard_path = self.directory / shard
                if not shard_path.is_file():  # follows symlinks: a Hugging Face cache's shards are links
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

    def validate(self, spec: ModelSpec) -> None:
        """`validate_checkpoint` once per spec (a loader validates before allocating; runtime_params again)."""
        if self._validated != spec:
            validate_checkpoint(self, spec)
            self._validated = spec


def _plain_file_name(shard: object) -> bool:
    """A name that can only mean a file directly inside the checkpoint directory."""
    return (
        isinstance(shard, str)
        and shard not in ("", ".", "..")
        and "/" not in shard
        and "\\" not in shard
        and "\0" not in shard
        and os.path.basename(shard) == shard
        and not os.path.isabs(shard)
    )


def runtime_params(
    checkpoint: Checkpoint,
    spec: ModelSpec,
    dtype: np.dtype | None = None,
    *,
    progress: bool = False,
    layout: ShardLayout | None = None,
    allow_nonfinite: bool | None = None,
    modules: Callable[[str], bool] | None = None,
    experts: range | None = None,
) -> Iterator[tuple[str, str, str, np.ndarray]]:
    """Yield (module, role, kind, array) for every runtime parameter, packed (and cast to `dtype` if given).

    The checkpoint is validated first (all problems in one error). Arrays are in torch layout; a Flax
    loader transposes LINEAR kinds. Casting happens here, one tensor at a time, so peak host memory
    stays near one tensor beyond the model itself. With a tensor-parallel `layout`, each array is that
    rank's slice (spec/parallel.py), cut from the memory map before anything is read. Each tensor read is
    scanned for NaN/Inf (a CheckpointError naming it) unless `allow_nonfinite` (None: the innermost
    `allow_nonfinite_weights()` block's setting, else False). `modules`: a filter on the runtime module path
    (e.g. one decoder layer's, for a layer-streamed check); only the parameters it keeps are read and yielded.
    `experts`: an expert-parallel rank's experts (spec/parallel.py's expert_range); a stacked experts parameter
    then holds only those, [len(experts), ...], in order.
    """
    allow = _ALLOW_NONFINITE.get() if allow_nonfinite is None else allow_nonfinite
    checkpoint.validate(spec)
    groups = {key: entries for key, entries in runtime_groups(spec).items() if modules is None or modules(key[0])}
    if experts is not None:
        groups = {k: [e for e in v if e.expert is None or e.expert in experts] for k, v in groups.items()}
    total_bytes = sum(checkpoint.nbytes(e.name) for entries in groups.values() for e in entries)
    bar = Progress(total_bytes, f"loading {checkpoint.directory.name}", enabled=progress, unit="B")
    # The scans run ahead, in order, on one worker thread while the caller copies (numpy's reduction releases the
    # GIL): on two cores the scan then hides behind the copy instead of adding a read pass to it. A broken tensor
    # still raises before it is yielded, naming it; a consumer that stops early cancels the scans not yet started.
    pool = ThreadPoolExecutor(1, thread_name_prefix="nonfinite-scan")
    try:
        scans = [None if allow else pool.submit(_scan, checkpoint, group, layout) for group in groups.values()]
        for ((module, role), entries), scan in zip(groups.items(), scans, strict=True):
            if scan is not None:
                scan.result()
            array = _pack(entries, [_cast(a, dtype) for a in _pieces(checkpoint, entries, layout)])
            bar.update(sum(checkpoint.nbytes(e.name) for e in entries))
            yield module, role, entries[0].kind, array
        bar.close()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _pack(entries: list[ParamEntry], arrays: list[np.ndarray]) -> np.ndarray:
    """One runtime parameter from its checkpoint pieces: parts concatenated along axis 0 ([parts * out, in]),
    then, for stacked experts, the experts stacked along a new leading axis ([E, parts * out, in])."""
    if entries[0].expert is None:
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
    per_expert: dict[int, list[np.ndarray]] = {}
    for entry, array in zip(entries, arrays, strict=True):
        per_expert.setdefault(entry.expert, []).append(array)
    return np.stack([np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0] for parts in per_expert.values()])


def _pieces(checkpoint: Checkpoint, entries: list[ParamEntry], layout: ShardLayout | None) -> list[np.ndarray]:
    """This rank's slice of each of one parameter's tensors: views of the memory map, nothing read yet (a padded
    vocabulary shard is a copy, made where it is used: the scan and the loader each make and drop their own)."""
    return [shard_of(checkpoint.get(e.name), e, layout) for e in entries]


def _scan(checkpoint: Checkpoint, entries: list[ParamEntry], layout: ShardLayout | None) -> None:
    """NaN/Inf in any of one parameter's pieces: a CheckpointError naming the tensor."""
    for entry, array in zip(entries, _pieces(checkpoint, entries, layout), strict=True):
        check_finite(array, entry.name, checkpoint.directory)


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
        raise CheckpointError("cannot write checkpoint:" + format_problems(problems))


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)
