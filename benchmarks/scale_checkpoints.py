"""Random Qwen3-shaped checkpoints at the sizes people port (0.6B, 1.7B, 8B), for benchmarks/check_scale.py.

The real models' shapes (the 8B untied, like Qwen3-8B) with deterministic random weights, bf16, written once
into a cache directory with the project's writer (`spec.write_checkpoint`, in 2 GB shards) and reused. The
writer takes every tensor up front; here each tensor is a `_Drawn` stand-in, drawn only when the writer
serializes its shard, so an 8B checkpoint (16 GB in bf16) is written in the memory of one shard, not of the
model. "8b-4l" is the 8B shape with 4 layers: the same layer size, a ninth of the layer count, which shows
whether a streamed check's memory follows the layer size or the layer count. Drawing and writing print
progress; the free disk space is checked first.

    python benchmarks/scale_checkpoints.py 8b        # prints the directory, writing it if needed
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.qwen3_shape import QWEN3_0_6B
from spec import ModelSpec, param_table, parameter_count, write_checkpoint
from spec.default import default_cache_dir
from spec.params import BIAS, EMBEDDING, NORM, ParamEntry
from spec.progress import Progress

QWEN3_1_7B = dataclasses.replace(QWEN3_0_6B, hidden_size=2048, intermediate_size=6144)
QWEN3_8B = dataclasses.replace(
    QWEN3_0_6B,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    tie_word_embeddings=False,
)
SIZES: dict[str, ModelSpec] = {
    "0.6b": QWEN3_0_6B,
    "1.7b": QWEN3_1_7B,
    "8b": QWEN3_8B,
    "8b-4l": dataclasses.replace(QWEN3_8B, num_hidden_layers=4),
}
SHARD_BYTES = 2 << 30  # the writer holds one shard's tensors before writing it
_DRAW_ELEMENTS = 1 << 24
_HEADROOM = 1 << 30  # disk left free after writing


class _Drawn:
    """A tensor drawn when the writer asks for its bytes (`np.asarray`), in bf16, with its own seed."""

    def __init__(self, entry: ParamEntry, seed: int, bar: Progress):
        import ml_dtypes

        self.entry, self.seed, self.bar = entry, seed, bar
        self.shape, self.dtype = entry.shape, np.dtype(ml_dtypes.bfloat16)
        self.nbytes = int(np.prod(entry.shape)) * 2

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        e = self.entry
        out = np.empty(e.shape, self.dtype)
        rows = max(1, _DRAW_ELEMENTS // max(1, int(np.prod(e.shape[1:]))))
        for start in range(0, e.shape[0], rows):  # in row blocks: no float32 copy of a whole [V, H] table
            shape = (min(rows, e.shape[0] - start), *e.shape[1:])
            if e.kind == NORM:  # the scales of spec.random_weights, drawn in float32 (benchmarks/qwen3_shape.py)
                block = 1.0 + 0.1 * rng.standard_normal(shape, np.float32)
            elif e.kind in (EMBEDDING, BIAS):
                block = 0.1 * rng.standard_normal(shape, np.float32)
            else:
                block = rng.standard_normal(shape, np.float32) / np.float32(np.sqrt(e.shape[1]))
            out[start : start + shape[0]] = block
        self.bar.update(self.nbytes)
        return out if dtype is None else out.astype(dtype)


def checkpoint_bytes(spec: ModelSpec) -> int:
    return parameter_count(spec) * 2  # bf16


def scale_checkpoint(size: str, cache: Path | None = None) -> Path:
    """The directory of the random bf16 checkpoint of `size` (a key of SIZES), written first if needed."""
    spec = SIZES[size]
    directory = (cache or default_cache_dir()) / f"qwen3-{size}-random-bfloat16"
    if (directory / "config.json").is_file():  # written last: a directory without it is an interrupted write
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    need, free = checkpoint_bytes(spec), shutil.disk_usage(directory).free
    if need + _HEADROOM > free:
        raise SystemExit(
            f"not enough disk for {directory}: the {size} checkpoint needs {need / 1e9:.1f} GB "
            f"(+{_HEADROOM / 1e9:.0f} GB headroom), {free / 1e9:.1f} GB free (df -h {directory.parent})"
        )
    print(f"writing {directory}: {need / 1e9:.1f} GB of bf16, {free / 1e9:.1f} GB free", file=sys.stderr)
    bar = Progress(need, f"drawing and writing {directory.name}", unit="B")
    tensors = {e.name: _Drawn(e, k, bar) for k, e in enumerate(param_table(spec))}
    start = time.perf_counter()
    write_checkpoint(directory, spec, tensors, max_shard_bytes=SHARD_BYTES)
    bar.close()
    print(f"wrote {directory} in {time.perf_counter() - start:.0f}s", file=sys.stderr)
    return directory


if __name__ == "__main__":
    print(scale_checkpoint(sys.argv[1] if len(sys.argv) > 1 else "0.6b"))
