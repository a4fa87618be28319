"""A checkpoint read piece by piece, framework-neutral: what a layer-streamed check needs from the parameter table.

A streamed check (parity/stream.py) runs the model one piece at a time: the embedding rows the ids read, one
decoder layer, the final norm and the head. `torch_impl/layerwise.py` and `jax_impl/layerwise.py` build each
piece from the numpy arrays this module yields, which all come from `runtime_params` (validated, packed,
scanned for NaN/Inf), restricted to the piece's modules.

Each piece opens the checkpoint directory afresh: its memory maps, and with them the file pages the piece
touched, are released once the piece is read. Pages of a memory-mapped file count in a process's resident
memory while they stay mapped, so one `Checkpoint` kept open for the whole stream would grow to the size of
the checkpoint (16 GB for an 8B model in bfloat16) as the layers are read; reopened per piece, it holds one.

The head's table ([V, H]: the untied `lm_head`, or the embedding when tied) is read in blocks of rows, each
holding a quarter of one decoder layer's elements (at least 32M), so the head never holds more than a layer
does; the logits of a block are the same dot products as the whole table's.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spec.checkpoint import Checkpoint, runtime_params
from spec.config import ModelSpec
from spec.errors import InputError
from spec.params import EMBEDDING, LINEAR, NORM, VOCAB, param_table

HEAD_BLOCK_MIN_ELEMENTS = 1 << 25  # 128 MB in float32: a constant, so the head's memory still follows the layer's


def layer_prefix(index: int) -> str:
    """The module path prefix of decoder layer `index` in both backends and the parameter table."""
    return f"model.layers.{index}."


def embedding_module(spec: ModelSpec) -> str:
    return next(e.module for e in param_table(spec) if e.kind == EMBEDDING)


def head_module(spec: ModelSpec) -> str:
    """The module whose [V, H] table gives the logits: the untied head, or the embedding itself when tied."""
    table = param_table(spec)
    return next((e.module for e in table if e.kind == LINEAR and e.placement == VOCAB), embedding_module(spec))


def final_norm_module(spec: ModelSpec) -> str:
    """The norm after the last layer: the one NORM row outside the decoder layers."""
    return next(e.module for e in param_table(spec) if e.kind == NORM and not e.module.startswith("model.layers."))


def layer_params(
    directory: str | Path, spec: ModelSpec, index: int, dtype: np.dtype | None = None
) -> Iterator[tuple[str, str, str, np.ndarray]]:
    """(module path inside the layer, role, kind, array) for every runtime parameter of decoder layer `index`,
    cast to `dtype`: `runtime_params` restricted to the layer ("self_attn.q_proj", "mlp.gate_up_proj", ...)."""
    prefix = layer_prefix(index)
    checkpoint = Checkpoint(directory)  # its own maps: released when this generator ends
    for module, role, kind, array in runtime_params(checkpoint, spec, dtype, modules=lambda m: m.startswith(prefix)):
        yield module[len(prefix) :], role, kind, array


def check_layer_call(embedded: bool, routing: Sequence[Any] | None, inputs: int) -> list[Any]:
    """Both backends' `Layerwise.run_layer` checks, in one order: the batch embedded first (embed sets its positions
    and mask), then the teacher-forced routing, one entry per input (its expert ids [B, T, k], or None), returned as
    a list; the entries themselves are checked by each backend's check_routing, as a whole model checks them."""
    if not embedded:
        raise InputError(
            "run_layer before embed: a streamed forward starts with embed(ids), which sets the batch's positions "
            "and mask"
        )
    if routing is None:
        return [None] * inputs
    if isinstance(routing, (dict, str, bytes)) or not isinstance(routing, Sequence):
        raise InputError(
            f"run_layer's routing is one entry per input (this layer's expert ids [B, T, k], or None), got "
            f"{type(routing).__name__}; a whole model's forward takes the dict layer -> ids"
        )
    if len(routing) != inputs:
        raise InputError(f"run_layer's routing has {len(routing)} entries for {inputs} inputs: one per input")
    return list(routing)


def module_param(directory: str | Path, spec: ModelSpec, module: str, dtype: np.dtype | None = None) -> np.ndarray:
    """The one runtime parameter of a single-parameter module (the final norm's weight), cast to `dtype`."""
    arrays = [a for *_, a in runtime_params(Checkpoint(directory), spec, dtype, modules=lambda m: m == module)]
    if len(arrays) != 1:
        raise AssertionError(f"{module}: {len(arrays)} runtime parameters, expected 1")
    return np.array(arrays[0])  # a copy: the memory map goes with the Checkpoint


def embedding_rows(directory: str | Path, spec: ModelSpec, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, inverse): the distinct rows of the embedding table that `ids` [B, T] read ([U, H], the checkpoint's
    dtype, copied out of the memory map) and each id's index among them ([B, T]), so rows[inverse] == E[ids].

    A gather copies rows, so gathering from these rows gives the bits the whole table gives. The table is
    still scanned for NaN/Inf as a whole (runtime_params), as a whole-model load scans it."""
    unique, inverse = np.unique(np.asarray(ids), return_inverse=True)
    module = embedding_module(spec)
    (table,) = [a for *_, a in runtime_params(Checkpoint(directory), spec, modules=lambda m: m == module)]
    rows = np.ascontiguousarray(table[unique])  # [U, H]: a copy of only these rows
    release_pages(table)
    return rows, inverse.reshape(np.shape(ids)).astype(np.int64)


def head_block_rows(spec: ModelSpec) -> int:
    """Rows of the head's table per block: a quarter of one decoder layer's parameters ([rows, H]), so that a block
    cast to float32 with the copies a backend makes on the way stays under a layer's size; but at least
    HEAD_BLOCK_MIN_ELEMENTS, so that a small model's head is a few products, not dozens of tiny ones."""
    layer = sum(int(np.prod(e.shape)) for e in param_table(spec) if e.module.startswith(layer_prefix(0)))
    return max(1, min(spec.vocab_size, max(layer // 4, HEAD_BLOCK_MIN_ELEMENTS) // spec.hidden_size))


def head_blocks(
    directory: str | Path, spec: ModelSpec, rows: int | None = None
) -> Iterator[tuple[int, str, np.ndarray]]:
    """(first row, kind, block [rows, H]) over the head's table in order: LINEAR for an untied head (a Linear's
    [out, in] weight), EMBEDDING for a tied one (the embedding table itself). A block is a read-only view of
    the memory map, valid until the next one is asked for: copy it (a backend's parameter does)."""
    rows = rows or head_block_rows(spec)
    module = head_module(spec)
    for _, _, kind, table in runtime_params(Checkpoint(directory), spec, modules=lambda m: m == module):
        release_pages(table)  # the NaN scan read every page: keep none resident beyond the block in use
        for start in range(0, table.shape[0], rows):
            block = table[start : start + rows]  # [rows, H]
            yield start, kind, block
            release_pages(block)


def release_pages(view: np.ndarray) -> None:
    """Drop the pages under `view`, a contiguous view of a read-only memory map, from this process's resident
    memory (madvise DONTNEED): the page cache keeps them, so reading them again costs no disk access, but the
    process no longer counts them. A no-op for an array that is not a view of a memory map, or without madvise."""
    root = view
    while isinstance(root.base, np.ndarray):
        root = root.base
    mapped = root.base
    if not (isinstance(mapped, mmap.mmap) and hasattr(mapped, "madvise") and view.flags.c_contiguous and view.size):
        return
    origin = np.frombuffer(mapped, dtype=np.uint8, count=1).ctypes.data  # the address of the map's first byte
    page = mmap.PAGESIZE
    begin = (view.ctypes.data - origin) // page * page
    end = min(len(mapped), -(-(view.ctypes.data - origin + view.nbytes) // page) * page)
    mapped.madvise(mmap.MADV_DONTNEED, begin, end - begin)


__all__ = [
    "embedding_module",
    "embedding_rows",
    "final_norm_module",
    "head_block_rows",
    "head_blocks",
    "head_module",
    "layer_params",
    "layer_prefix",
    "module_param",
    "release_pages",
]
