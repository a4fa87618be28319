"""A Qwen3-0.6B-shaped random checkpoint written with the project's own writer, for benchmarks.

28 layers, hidden 1024, intermediate 3072, 16 query / 8 kv heads of head_dim 128, vocabulary 151936,
tied: the real model's shapes (596M parameters) with deterministic random weights. Written once into a
cache directory; progress on stderr while the 2.4 GB (float32) are drawn and written.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from spec import ModelSpec, write_checkpoint
from spec.default import default_cache_dir
from spec.params import BIAS, EMBEDDING, NORM, param_table
from spec.progress import Progress

QWEN3_0_6B = ModelSpec(
    model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
    rope_scaling=None, max_position_embeddings=40960, tie_word_embeddings=True, attention_bias=False, qk_norm=True,
)  # fmt: skip


def qwen3_0_6b_checkpoint(dtype: str = "float32", directory: Path | None = None) -> Path:
    """Directory of the random Qwen3-0.6B-shaped checkpoint in `dtype` (float32 or bfloat16), made once."""
    directory = directory or default_cache_dir() / f"qwen3-0.6b-random-{dtype}"
    if (directory / "config.json").is_file():
        return directory
    import ml_dtypes

    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(0)
    table = param_table(QWEN3_0_6B)
    bar = Progress(len(table), f"drawing {directory.name}", unit="")
    tensors = {}
    for entry in table:  # the same scales as spec.random_weights, drawn in float32 to halve the time
        if entry.kind == NORM:
            array = 1.0 + 0.1 * rng.standard_normal(entry.shape, np.float32)
        elif entry.kind in (EMBEDDING, BIAS):
            array = 0.1 * rng.standard_normal(entry.shape, np.float32)
        else:
            array = rng.standard_normal(entry.shape, np.float32) / np.float32(np.sqrt(entry.shape[1]))
        tensors[entry.name] = array.astype(np_dtype)
        bar.update()
    bar.close()
    start = time.perf_counter()
    write_checkpoint(directory, QWEN3_0_6B, tensors, max_shard_bytes=1 << 30)
    print(f"wrote {directory} in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    return directory


if __name__ == "__main__":
    print(qwen3_0_6b_checkpoint(sys.argv[1] if len(sys.argv) > 1 else "float32"))
