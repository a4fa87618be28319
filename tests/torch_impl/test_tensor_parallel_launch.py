"""Tensor parallelism's launcher (torch_impl/tp_launch.py): a degree that does not divide is refused before any
process is spawned, a rank's error and the caller's allow-nonfinite setting cross the process boundary, and the
entry point a CLI calls. Sharded against unsharded results: tests/torch_impl/test_tensor_parallel.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import spec
import torch_impl
from spec import ConfigError, InputError
from spec.checkpoint import allow_nonfinite_weights, nonfinite_weights_allowed
from spec.parallel import check_tp_degree
from tests.greedy import assert_same_greedy
from tests.torch_impl.tp_rank_checks import IDS, PROMPTS
from torch_impl import tp_launch
from torch_impl.tp_launch import launch_generate, launch_logits, run_tp


def test_bad_degree_names_what_does_not_divide(default_dir):
    with pytest.raises(ConfigError) as err:
        check_tp_degree(spec.DEFAULT_SPEC, 3)
    message = str(err.value)
    for part in ("degree 3", "num_attention_heads=4", "num_key_value_heads=2", "intermediate_size=176"):
        assert part in message
    with pytest.raises(ConfigError, match=r"does not divide num_attention_heads=4$"):
        check_tp_degree(spec.DEFAULT_SPEC, 8)  # kv heads (2 | 8) and intermediate (8 | 176) do fit
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ConfigError, match="positive integer"):
            check_tp_degree(spec.DEFAULT_SPEC, bad)
    with pytest.raises(ConfigError, match="degree 3"):  # refused before any process is spawned
        launch_logits(default_dir, IDS, 3)


def _raise_on_rank_one() -> None:
    if dist.get_rank() == 1:
        raise InputError("rank one refuses")
    dist.barrier()  # rank 0 waits in a collective until spawn stops it


def test_a_rank_error_reaches_the_caller_with_its_type():
    with pytest.raises(InputError, match="rank one refuses"):
        run_tp(_raise_on_rank_one, 2)


def _ranks_allow_nonfinite() -> bool:
    allowed = torch.tensor([int(nonfinite_weights_allowed())])
    dist.all_reduce(allowed, op=dist.ReduceOp.MIN)
    return bool(allowed.item())


@pytest.mark.parametrize("allow", [True, False])
def test_allow_nonfinite_reaches_every_rank(allow):
    """`check --tp N --allow-nonfinite`: the caller's setting is a context variable, which spawned processes
    would not inherit; run_tp hands it over, so every rank's loader agrees with the caller."""
    with allow_nonfinite_weights(allow):
        assert run_tp(_ranks_allow_nonfinite, 2) is allow


def test_launcher_entry_points(default_dir):
    """What a CLI calls: launch_generate returns rank 0's Generation, tokens as the unsharded model's."""
    ref = torch_impl.generate(torch_impl.from_pretrained(default_dir), PROMPTS, 4, eos_token_ids=(), return_logits=True)
    sharded = launch_generate(default_dir, PROMPTS, 4, 2, eos_token_ids=()).tokens
    assert_same_greedy({"unsharded": ref.tokens, "tp=2": sharded}, ref.logits)  # the sharded sums' order differs


def _step_an_optimizer() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight])  # its first construction imports torch._dynamo, and with it
    weight.sum().backward()  # torch.distributed.nn.functional, whose defaults take the group living then
    optimizer.step()


def _worker_then_threads(rank: int, workdir: str) -> None:
    """A run_tp rank (tp_launch._worker, stepping an optimizer) that afterwards writes its threads' names."""
    tp_launch._worker(rank, _step_an_optimizer, (2, 1), "gloo", workdir, None, False, ())
    names = sorted(path.read_text().strip() for path in Path("/proc/self/task").glob("*/comm"))
    (Path(workdir) / f"threads{rank}.txt").write_text("\n".join(names))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from Linux's /proc")
def test_no_gloo_thread_outlives_a_rank_that_trained():
    """A group that outlives destroy_process_group keeps gloo's threads running into the interpreter's exit, where
    they abort the rank now and then (SIGABRT); an optimizer made in a rank used to keep it (tp_launch._worker)."""
    with tempfile.TemporaryDirectory() as workdir:
        torch.multiprocessing.spawn(_worker_then_threads, args=(workdir,), nprocs=2, join=True)
        for rank in range(2):
            names = (Path(workdir) / f"threads{rank}.txt").read_text().split()
            assert names and not [name for name in names if "gloo" in name], (rank, names)
