"""Random checkpoints of real models' shapes, written with the project's own writer, for benchmarks.

Qwen3-0.6B: 28 layers, hidden 1024, intermediate 3072, 16 query / 8 kv heads of head_dim 128, vocabulary
151936, tied: the real model's shapes (596M parameters). Qwen3-MoE (Qwen3-30B-A3B scaled down to fit a 24 GB
machine beside three backends): its 48 layers and its sparsity, k / E = 1/16 (2 of 32 experts here, 8 of 128
there), at hidden 384, expert width 192, 6 query / 2 kv heads of head_dim 64, vocabulary 32000, untied: 384M
parameters, of which a decoded token reads 53M. Deterministic random weights, written once into a cache
directory; progress on stderr while they are drawn and written.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from spec import ModelSpec, parameter_count, write_checkpoint
from spec.default import default_cache_dir
from spec.params import BIAS, EMBEDDING, NORM, param_table
from spec.progress import Progress

QWEN3_0_6B = ModelSpec(
    model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
    rope_scaling=None, max_position_embeddings=40960, tie_word_embeddings=True, attention_bias=False, qk_norm=True,
)  # fmt: skip


QWEN3_MOE = ModelSpec(
    model_type="qwen3_moe", vocab_size=32000, hidden_size=384, intermediate_size=1024, num_hidden_layers=48,
    num_attention_heads=6, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
    rope_scaling=None, max_position_embeddings=40960, tie_word_embeddings=False, attention_bias=False, qk_norm=True,
    num_experts=32, num_experts_per_tok=2, moe_intermediate_size=192, norm_topk_prob=True,
)  # fmt: skip
SHAPES = {"qwen3-0.6b": QWEN3_0_6B, "qwen3-moe": QWEN3_MOE}


def active_parameters(spec: ModelSpec) -> int:
    """Parameters one decoded token reads: all of them, less the (E - k) unselected experts of each sparse layer
    and, in an untied model, the embedding rows other than the token's own (the head reads a tied table whole)."""
    per_expert = 3 * spec.hidden_size * spec.moe_intermediate_size
    unread = (spec.num_experts - spec.num_experts_per_tok) * per_expert * len(spec.sparse_layers)
    if not spec.tie_word_embeddings:
        unread += (spec.vocab_size - 1) * spec.hidden_size
    return parameter_count(spec) - unread


def qwen3_0_6b_checkpoint(dtype: str = "float32", directory: Path | None = None) -> Path:
    """Directory of the random Qwen3-0.6B-shaped checkpoint in `dtype` (float32 or bfloat16), made once."""
    return shaped_checkpoint("qwen3-0.6b", dtype, directory)


def shaped_checkpoint(shape: str, dtype: str = "float32", directory: Path | None = None) -> Path:
    """Directory of the random checkpoint of SHAPES[shape] in `dtype` (float32 or bfloat16), made once."""
    spec = SHAPES[shape]
    directory = directory or default_cache_dir() / f"{shape}-random-{dtype}"
    if (directory / "config.json").is_file():
        return directory
    import ml_dtypes

    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(0)
    table = param_table(spec)
    bar = Progress(len(table), f"drawing {directory.name}", unit="")
    tensors = {}
    for entry in table:  # the same scales as spec.random_weights, drawn in float32 to halve the time
        if entry.kind == NORM:
            array = 1.0 + 0.1 * rng.standard_normal(entry.shape, np.float32)
        elif entry.kind in (EMBEDDING, BIAS):
            array = 0.1 * rng.standard_normal(entry.shape, np.float32)
        else:
            array = rng.standard_normal(entry.shape, np.float32) / np.float32(np.sqrt(entry.shape[-1]))
        tensors[entry.name] = array.astype(np_dtype)
        bar.update()
    bar.close()
    start = time.perf_counter()
    write_checkpoint(directory, spec, tensors, max_shard_bytes=1 << 30)
    print(f"wrote {directory} in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    return directory


if __name__ == "__main__":
    print(shaped_checkpoint(*sys.argv[1:3]) if len(sys.argv) > 1 else qwen3_0_6b_checkpoint())
