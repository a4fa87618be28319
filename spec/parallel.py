"""Tensor parallelism from the partition table: what each rank holds, read by both backends.

Framework-neutral (docs/design.md, "The partition table"). `ShardLayout` says which heads, kv heads,
intermediate features and vocabulary rows rank `rank` of `tp` holds; `shard_of` cuts a checkpoint tensor
(a memory-mapped view, so only the slice is ever read) by its `placement` and `units` in spec/params.py.
torch_impl builds each rank's modules from `local_spec` (one process per rank); jax_impl builds one global
model from `global_spec` and places every device's slice, so the two read the same bytes per rank.

The rules, once: a COLUMN or ROW tensor's split axis holds `units` equal blocks (heads, kv heads,
features); when `tp` divides them a rank takes a contiguous run of blocks, and when `tp` is a multiple of
them (kv heads only) the blocks are replicated: rank r takes block r * units // tp, the kv head its query
heads read. VOCAB rows are padded with zeros to a multiple of `tp` (the padded logits are masked to -inf).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spec.config import ModelSpec
from spec.errors import ConfigError
from spec.params import COLUMN, REPLICATED, ROW, VOCAB, ParamEntry


def check_tp_degree(spec: ModelSpec, tp: int) -> None:
    """Raise a ConfigError naming every dimension that `tp` cannot split (the vocabulary is padded)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tensor-parallel degree must be a positive integer, got {tp!r}")
    problems = []
    if spec.num_attention_heads % tp:
        problems.append(f"it does not divide num_attention_heads={spec.num_attention_heads}")
    n_kv = spec.num_key_value_heads
    if n_kv % tp and tp % n_kv:
        problems.append(
            f"it neither divides num_key_value_heads={n_kv} nor is a multiple of it "
            "(kv heads are split when it divides them, replicated when it is a multiple)"
        )
    if spec.intermediate_size % tp and len(spec.sparse_layers) < spec.num_hidden_layers:
        problems.append(f"it does not divide intermediate_size={spec.intermediate_size}")
    for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if getattr(spec, name) % tp:
            problems.append(f"it does not divide {name}={getattr(spec, name)}")
    if problems:
        raise ConfigError(f"tensor-parallel degree {tp} does not fit this model: " + "; ".join(problems))


def check_ep_degree(spec: ModelSpec, ep: int) -> None:
    """Expert parallelism: `ep` ranks each hold num_experts / ep whole experts of every sparse layer."""
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ConfigError(f"expert-parallel degree must be a positive integer, got {ep!r}")
    if ep > 1 and not spec.num_experts:
        raise ConfigError(f"expert-parallel degree {ep} needs a mixture-of-experts model ({spec.model_type} is dense)")
    if ep > 1 and spec.num_experts % ep:
        raise ConfigError(f"expert-parallel degree {ep} does not divide num_experts={spec.num_experts}")


def expert_range(spec: ModelSpec, ep: int, rank: int) -> range:
    """The experts (global indices) that expert-parallel rank `rank` of `ep` holds: a contiguous run."""
    check_ep_degree(spec, ep)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ep:
        raise ConfigError(f"expert-parallel rank {rank!r} is outside [0, {ep})")
    n = spec.num_experts // ep
    return range(rank * n, (rank + 1) * n)


def padded_vocab(spec: ModelSpec, tp: int) -> int:
    """The vocabulary rounded up to a multiple of the degree; padding rows are zero, their logits -inf."""
    return -(-spec.vocab_size // tp) * tp


def blocks(units: int, tp: int, rank: int) -> range:
    """The blocks of a split axis that `rank` holds: a contiguous run, or the one replicated block."""
    if units % tp == 0:
        n = units // tp
        return range(rank * n, (rank + 1) * n)
    first = rank * units // tp  # tp is a multiple of units: replicated, the block this rank's heads read
    return range(first, first + 1)


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """What rank `rank` of `tp` holds of the full `spec`; tp = 1 is the unsharded model."""

    spec: ModelSpec
    tp: int
    rank: int = 0

    def __post_init__(self) -> None:
        check_tp_degree(self.spec, self.tp)
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.tp:
            raise ConfigError(f"tensor-parallel rank {self.rank!r} is outside [0, {self.tp})")

    @property
    def heads(self) -> range:
        return blocks(self.spec.num_attention_heads, self.tp, self.rank)

    @property
    def kv_heads(self) -> range:
        return blocks(self.spec.num_key_value_heads, self.tp, self.rank)

    @property
    def intermediate(self) -> range:
        return blocks(self.spec.intermediate_size, self.tp, self.rank)

    @property
    def padded_vocab(self) -> int:
        return padded_vocab(self.spec, self.tp)

    @property
    def vocab_shard(self) -> int:
        return self.padded_vocab // self.tp

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_shard

    @property
    def local_spec(self) -> ModelSpec:
        """The spec of one rank's modules (torch_impl): local heads / local kv heads still form the groups."""
        return dataclasses.replace(
            self.spec,
            num_attention_heads=len(self.heads),
            num_key_value_heads=len(self.kv_heads),
            intermediate_size=len(self.intermediate),
            vocab_size=self.vocab_shard,
        )

    @property
    def global_spec(self) -> ModelSpec:
        """The spec of all ranks' modules side by side (jax_impl's one global model): replicated kv heads
        count once per rank, and the vocabulary is padded. tp = 1 gives `spec` itself."""
        return dataclasses.replace(
            self.spec,
            num_key_value_heads=len(self.kv_heads) * self.tp,
            vocab_size=self.padded_vocab,
        )


def split_axis(entry: ParamEntry) -> int | None:
    """The axis of the checkpoint tensor (torch layout) that `entry`'s placement splits; None if replicated."""
    return {COLUMN: 0, VOCAB: 0, ROW: 1, REPLICATED: None}[entry.placement]


def shard_of(array: np.ndarray, entry: ParamEntry, layout: ShardLayout | None) -> np.ndarray:
    """This rank's slice of one checkpoint tensor (a view where no padding is needed: nothing is read yet)."""
    axis = split_axis(entry)
    if layout is None or layout.tp == 1 or axis is None:
        return array
    if entry.placement == VOCAB:
        rows = array[layout.vocab_start : layout.vocab_start + layout.vocab_shard]
        pad = layout.vocab_shard - rows.shape[0]
        return np.concatenate([rows, np.zeros((pad, *rows.shape[1:]), rows.dtype)]) if pad else rows
    width = array.shape[axis] // entry.units  # one block: a head's d, or one feature
    taken = blocks(entry.units, layout.tp, layout.rank)
    index = [slice(None)] * array.ndim
    index[axis] = slice(taken.start * width, taken.stop * width)
    return array[tuple(index)]


def holders(entry: ParamEntry, tp: int) -> int:
    """How many of `tp` ranks hold each element of `entry`'s tensor: all of them for a replicated tensor (norms),
    tp // units for a replicated kv-head block, 1 where the tensor is split. A global gradient norm over the
    ranks' tensors counts each element's square once by dividing it by this."""
    axis = split_axis(entry)
    if tp == 1:
        return 1
    if axis is None:
        return tp
    if entry.placement != VOCAB and entry.units % tp:
        return tp // entry.units
    return 1


def replicated_block(entry: ParamEntry, tp: int) -> bool:
    """Whether `entry` is split into blocks that several ranks hold alike (kv heads when tp > their count)."""
    return split_axis(entry) is not None and holders(entry, tp) > 1


def gather_shards(shards: list[np.ndarray], entry: ParamEntry, *, sum_replicas: bool = True) -> np.ndarray:
    """Every rank's slice of one checkpoint tensor (rank order) -> the whole tensor: the inverse of `shard_of`.

    A block that several ranks hold (a replicated kv head): for gradients (`sum_replicas`) it receives the SUM of
    their slices, since each replica's gradient comes from its own query heads; for parameters (which the
    replicas hold alike) the first holder's copy. Replicated tensors (norms) are the same on every rank and are
    taken from rank 0; the vocabulary padding is dropped.
    """
    tp, axis = len(shards), split_axis(entry)
    if axis is None or tp == 1:
        return shards[0]
    if entry.placement == VOCAB:
        return np.concatenate(shards, axis=0)[: entry.shape[0]]
    if entry.units % tp == 0:
        return np.concatenate(shards, axis=axis)
    width = entry.shape[axis] // entry.units
    whole = np.zeros(entry.shape, np.result_type(*shards))
    for rank, shard in enumerate(shards):
        taken = blocks(entry.units, tp, rank)
        index = [slice(None)] * whole.ndim
        index[axis] = slice(taken.start * width, taken.stop * width)
        if sum_replicas:
            whole[tuple(index)] += shard
        elif rank == tp * taken.start // entry.units:  # the first rank holding this block
            whole[tuple(index)] = shard
    return whole


__all__ = [
    "ShardLayout",
    "blocks",
    "check_tp_degree",
    "gather_shards",
    "holders",
    "padded_vocab",
    "replicated_block",
    "shard_of",
    "split_axis",
]
