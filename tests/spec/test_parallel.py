"""The partition table (spec/params.py placement, units) and the slicing both backends read (spec/parallel.py).

Pure numpy, no processes or devices: every rank's slice of every checkpoint tensor, put back together along
the axis its placement names, gives the tensor again; replicated kv heads are the head each rank's query
heads read; the vocabulary padding is zero; and a slice is a view of the memory map (nothing read yet).
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

import spec
from spec import ConfigError
from spec.parallel import (
    ShardLayout,
    blocks,
    check_tp_degree,
    gather_shards,
    holders,
    replicated_block,
    shard_of,
    split_axis,
)
from spec.params import COLUMN, REPLICATED, ROW, VOCAB
from tests.specs import QWEN2_SINGLE_KV

QWEN2_SPEC = QWEN2_SINGLE_KV  # untied, biased, one kv head: padded vocabulary, replicated kv heads


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return spec.write_checkpoint(tmp_path_factory.mktemp("qwen2"), QWEN2_SPEC, spec.random_weights(QWEN2_SPEC, 1))


def test_placements_of_the_table():
    """Each tensor's placement, by what it is: the table, not a backend, says how it splits."""
    by_name = {e.name: e for e in spec.param_table(QWEN2_SPEC)}
    p = "model.layers.0."
    expect = {
        "model.embed_tokens.weight": (VOCAB, 1),
        f"{p}self_attn.q_proj.weight": (COLUMN, 4),
        f"{p}self_attn.q_proj.bias": (COLUMN, 4),
        f"{p}self_attn.k_proj.weight": (COLUMN, 1),
        f"{p}self_attn.o_proj.weight": (ROW, 4),
        f"{p}mlp.gate_proj.weight": (COLUMN, 64),
        f"{p}mlp.up_proj.weight": (COLUMN, 64),
        f"{p}mlp.down_proj.weight": (ROW, 64),
        f"{p}input_layernorm.weight": (REPLICATED, 1),
        "lm_head.weight": (VOCAB, 1),
    }
    for name, (placement, units) in expect.items():
        assert (by_name[name].placement, by_name[name].units) == (placement, units), name
    for entry in by_name.values():  # a split axis always holds a whole number of blocks
        axis = split_axis(entry)
        assert axis is None or entry.placement == VOCAB or entry.shape[axis] % entry.units == 0, entry.name


def test_no_backend_switches_on_module_names():
    """Neither backend's tensor-parallel code names a projection: both read the partition table."""
    import jax_impl.tensor_parallel
    import torch_impl.tensor_parallel

    for module in (torch_impl.tensor_parallel, jax_impl.tensor_parallel):
        source = inspect.getsource(module)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj", "embed_tokens", "lm_head"):
            assert f'"{name}"' not in source, (module.__name__, name)


def test_blocks_split_or_replicate():
    assert [blocks(4, 2, r) for r in range(2)] == [range(0, 2), range(2, 4)]
    assert [blocks(2, 4, r) for r in range(4)] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]
    assert [blocks(1, 4, r) for r in range(4)] == [range(0, 1)] * 4


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_slices_reassemble_every_tensor(tp, qwen2_dir):
    checkpoint = spec.Checkpoint(qwen2_dir)
    layouts = [ShardLayout(QWEN2_SPEC, tp, r) for r in range(tp)]
    for entry in spec.param_table(QWEN2_SPEC):
        full = checkpoint.get(entry.name)
        shards = [shard_of(full, entry, layout) for layout in layouts]
        axis = split_axis(entry)
        where = f"{entry.name} at tp={tp}"
        if axis is None:
            assert all(s is full for s in shards), where
        elif entry.placement == VOCAB:
            rebuilt = np.concatenate(shards)
            assert rebuilt.shape[0] == layouts[0].padded_vocab, where
            np.testing.assert_array_equal(rebuilt[: full.shape[0]], full, err_msg=where)
            assert not rebuilt[full.shape[0] :].any(), where  # padding rows are zero
        elif entry.units % tp == 0:
            np.testing.assert_array_equal(np.concatenate(shards, axis=axis), full, err_msg=where)
        else:  # replicated kv heads: rank r holds head r * units // tp, the one its query heads read
            width = full.shape[axis] // entry.units
            for rank, shard in enumerate(shards):
                head = rank * entry.units // tp
                want = np.take(full, range(head * width, (head + 1) * width), axis=axis)
                np.testing.assert_array_equal(shard, want, err_msg=f"{where} rank {rank}")


def test_packed_gate_up_is_gate_then_up_per_rank(qwen2_dir):
    """runtime_params(layout=) packs each rank's own halves: [gate_r; up_r], so the local split stays right."""
    checkpoint, tp = spec.Checkpoint(qwen2_dir), 2
    gate = checkpoint.get("model.layers.0.mlp.gate_proj.weight")
    up = checkpoint.get("model.layers.0.mlp.up_proj.weight")
    half = QWEN2_SPEC.intermediate_size // tp
    for rank in range(tp):
        packed = dict(
            ((m, r), a)
            for m, r, _k, a in spec.runtime_params(checkpoint, QWEN2_SPEC, layout=ShardLayout(QWEN2_SPEC, tp, rank))
        )[("model.layers.0.mlp.gate_up_proj", "weight")]
        rows = slice(rank * half, (rank + 1) * half)
        np.testing.assert_array_equal(packed, np.concatenate([gate[rows], up[rows]]))


def test_a_slice_reads_nothing_until_copied(qwen2_dir):
    """A rank's slice is a view of the memory-mapped file: only the slice's bytes are read when a backend
    copies it (vocabulary slices that need padding are the one copy, of the shard alone)."""
    checkpoint = spec.Checkpoint(qwen2_dir)
    layout = ShardLayout(QWEN2_SPEC, 2, 1)
    for entry in spec.param_table(QWEN2_SPEC):
        full = checkpoint.get(entry.name)
        shard = shard_of(full, entry, layout)
        if entry.placement != VOCAB or shard.shape[0] == full[layout.vocab_start :].shape[0]:
            assert np.shares_memory(shard, full), entry.name


def test_local_and_global_specs():
    local = ShardLayout(QWEN2_SPEC, 4, 3).local_spec
    assert (local.num_attention_heads, local.num_key_value_heads, local.intermediate_size) == (1, 1, 16)
    assert local.vocab_size == 304 // 4
    whole = ShardLayout(QWEN2_SPEC, 4).global_spec  # JAX: every rank's shards side by side
    assert (whole.num_attention_heads, whole.num_key_value_heads, whole.vocab_size) == (4, 4, 304)
    assert ShardLayout(QWEN2_SPEC, 1).global_spec == QWEN2_SPEC == ShardLayout(QWEN2_SPEC, 1).local_spec


def test_bad_degree_and_rank():
    with pytest.raises(ConfigError) as err:
        check_tp_degree(spec.DEFAULT_SPEC, 3)
    for part in ("degree 3", "num_attention_heads=4", "num_key_value_heads=2", "intermediate_size=176"):
        assert part in str(err.value)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ConfigError, match="positive integer"):
            ShardLayout(spec.DEFAULT_SPEC, bad)
    for rank in (-1, 2, True):
        with pytest.raises(ConfigError, match="rank"):
            ShardLayout(spec.DEFAULT_SPEC, 2, rank)
    odd = dataclasses.replace(QWEN2_SPEC, num_key_value_heads=2, num_attention_heads=6)
    with pytest.raises(ConfigError, match="num_key_value_heads=2"):
        check_tp_degree(odd, 3)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gather_shards_inverts_shard_of(tp, qwen2_dir):
    """Slices put back give the tensor; replicated kv heads' slices are summed (a gradient's replicas)."""
    checkpoint = spec.Checkpoint(qwen2_dir)
    layouts = [ShardLayout(QWEN2_SPEC, tp, r) for r in range(tp)]
    for entry in spec.param_table(QWEN2_SPEC):
        full = np.asarray(checkpoint.get(entry.name))
        shards = [np.asarray(shard_of(full, entry, layout)) for layout in layouts]
        whole = gather_shards(shards, entry)
        split = split_axis(entry) is not None and entry.placement != VOCAB and entry.units % tp != 0
        replicas = tp // entry.units if split else 1  # ranks holding each replicated block
        np.testing.assert_allclose(whole, full * replicas, rtol=1e-6, err_msg=f"{entry.name} tp={tp}")
        assert replicated_block(entry, tp) == split
        expected = {COLUMN: 1, ROW: 1, VOCAB: 1, REPLICATED: tp}[entry.placement] * replicas
        assert holders(entry, tp) == (1 if tp == 1 else expected), (entry.name, tp)
        # Parameters: one holder's copy, whatever the other replicas hold.
        noisy = [shard + 1000.0 * (r % (tp // entry.units)) if split else shard for r, shard in enumerate(shards)]
        np.testing.assert_array_equal(gather_shards(noisy, entry, sum_replicas=False), full, err_msg=entry.name)
