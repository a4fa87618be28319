"""The built-in default checkpoint and deterministic random weights for any spec.

`default_checkpoint()` writes (once, atomically) a small Qwen3-shaped checkpoint into a cache
directory, so every command works without a download: tied embeddings, grouped-query attention
(2 query heads per kv head), head_dim 24 != hidden/heads 16, q/k norm, a vocabulary that is not a power
of two, a byte-level tokenizer.json. `random_weights(spec, seed)` is what every test checkpoint of the
project's own is built from.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from spec.checkpoint import write_checkpoint
from spec.config import ModelSpec
from spec.errors import CheckpointError
from spec.params import BIAS, EMBEDDING, NORM, param_table

DEFAULT_VERSION = 2  # bump when the default's spec or weights change: the cache key includes it

DEFAULT_SPEC = ModelSpec(
    model_type="qwen3",
    vocab_size=263,
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    rope_scaling=None,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    attention_bias=False,
    qk_norm=True,
)
EOS_ID = 256  # <|endoftext|> in the default tokenizer: byte ids 0..255, then the specials
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def random_weights(spec: ModelSpec, seed: int = 0, dtype: np.dtype | type = np.float32) -> dict[str, np.ndarray]:
    """Deterministic weights at a scale that keeps activations O(1), so component errors are visible.

    Linear weights ~ N(0, 1/fan_in); embeddings ~ N(0, 0.1^2) (small beside the layer outputs, so a
    tied model does not just echo its input token); norm weights ~ 1 + N(0, 0.1) (not all ones,
    so that a norm whose weight is ignored is caught); biases ~ N(0, 0.1).
    """
    rng = np.random.default_rng(seed)
    tensors = {}
    for entry in param_table(spec):
        if entry.kind == NORM:
            array = 1.0 + 0.1 * rng.standard_normal(entry.shape)
        elif entry.kind == BIAS:
            array = 0.1 * rng.standard_normal(entry.shape)
        elif entry.kind == EMBEDDING:
            array = 0.1 * rng.standard_normal(entry.shape)
        else:
            array = rng.standard_normal(entry.shape) / np.sqrt(entry.shape[1])
        tensors[entry.name] = array.astype(dtype)
    return tensors


def byte_tokenizer_json() -> dict:
    """A byte-level BPE tokenizer (no merges: one token per byte) in the `tokenizers` JSON format."""
    from_byte = _bytes_to_unicode()
    vocab = {from_byte[b]: b for b in range(256)}
    added = [
        {
            "id": 256 + k,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for k, s in enumerate(_SPECIALS)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which ByteLevel pre-tokenization uses."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/decoder-parity, else ~/.cache/decoder-parity (a relative XDG_CACHE_HOME is ignored,
    as the XDG spec asks). A CheckpointError when there is no home directory to fall back on."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError) as err:  # no HOME and no password-database entry
            raise CheckpointError(
                f"cannot locate a cache directory: XDG_CACHE_HOME is unset and the home directory is unknown ({err}); "
                "set XDG_CACHE_HOME to a writable directory"
            ) from err
    return Path(base) / "decoder-parity"


def default_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """Directory of the built-in default checkpoint, written on first use (atomically, by rename).

    A cache that cannot be written (a file where a directory should be, no permission, a read-only file
    system) is a CheckpointError naming the path, not an OSError from deep inside the writer.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"default-qwen3-v{DEFAULT_VERSION}"
    if (target / "config.json").is_file():
        return target
    tmp = root / f".{target.name}.tmp{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        write_checkpoint(
            tmp,
            DEFAULT_SPEC,
            random_weights(DEFAULT_SPEC, seed=0),
            extra_config={"eos_token_id": EOS_ID, "bos_token_id": None},
        )
        (tmp / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(), ensure_ascii=False))
        (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_ID}) + "\n")
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = err.strerror or str(err)
        if err.filename and Path(err.filename) != root:
            reason = f"{err.filename}: {reason}"
        raise CheckpointError(
            f"cannot write the built-in default checkpoint into the cache directory {root} ({reason}); set "
            "XDG_CACHE_HOME to a writable directory, or pass a checkpoint directory"
        ) from err
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race (its copy is identical), or the rename itself failed
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise CheckpointError(f"cannot move the built-in default checkpoint into place at {target}") from None
    return target
