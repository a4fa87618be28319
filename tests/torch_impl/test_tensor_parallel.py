"""Tensor parallelism (torch_impl/tensor_parallel.py, vocab_parallel.py, tp_launch.py) on 2 and 4 gloo processes.

The slicing itself (spec/parallel.py, the partition table) is tested in tests/spec/test_parallel.py.

Spawning a process group costs seconds on a small CPU, so each degree spawns once and one worker runs
every check on every rank (`_rank_checks`), returning plain data that the test asserts on. Two
checkpoints: the built-in default (Qwen3, tied, 4 heads / 2 kv heads, V=263: padded at tp 2 and 4, kv
heads split at tp 2 and replicated at tp 4) and an untied Qwen2 with q/k/v bias and a single kv head.
Both have a vocabulary larger than every other dimension a greedy step touches, so "no process holds
a full-vocabulary tensor" can be checked as "no tensor has a dimension >= V".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import spec
import torch_impl
from spec import ConfigError, InputError, ModelSpec
from spec.checkpoint import allow_nonfinite_weights, nonfinite_weights_allowed
from spec.parallel import check_tp_degree
from tests.greedy import assert_same_greedy
from tests.specs import QWEN2_SINGLE_KV
from torch_impl.tp_launch import launch_generate, launch_logits, run_tp
from torch_impl.vocab_parallel import gather_logits, greedy_token

IDS = np.array([[0, 0, 0, 5, 17, 250, 3], [11, 262, 1, 2, 3, 4, 100]])  # row 0 left-padded by MASK
MASK = np.array([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
PROMPTS = [[5, 17, 250, 3], [11, 262, 1, 2, 3, 4, 100], [42]]  # ragged: generate left-pads them
NEW_TOKENS = 6
SAMPLING = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 3}

QWEN2_SPEC = QWEN2_SINGLE_KV  # untied, biased, one kv head: padded vocabulary, replicated kv heads


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return spec.write_checkpoint(tmp_path_factory.mktemp("qwen2"), QWEN2_SPEC, spec.random_weights(QWEN2_SPEC, 1))


class ShapeRecorder(TorchDispatchMode):
    """Records the shape of every tensor that any aten op (factories and collectives included) takes or makes."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves((args, kwargs, out)):
            if isinstance(leaf, torch.Tensor):
                self.shapes.append((str(func), tuple(leaf.shape)))
        return out

    def vocabulary_sized(self, vocab: int, padded: int) -> list[tuple[str, tuple[int, ...]]]:
        """Tensors with a whole vocabulary along some dim, flattened ones included (a multiple of V or V_pad)."""

        def full(d: int) -> bool:
            return any(d >= v and d % v == 0 for v in (vocab, padded))

        return sorted({(op, shape) for op, shape in self.shapes if any(full(d) for d in shape)})

    def at_least(self, size: int) -> list[tuple[str, tuple[int, ...]]]:
        return sorted({(op, shape) for op, shape in self.shapes if any(d >= size for d in shape)})


def _rank_checks(cases: list[tuple[str, bool]]) -> tuple[list[list[dict]], list[list[int]]]:
    """On every rank, for each (checkpoint, also_bf16): facts and results; rank 0 returns [case][rank].

    Also greedy_token on crafted shards of 4 ids per rank, one row each: every rank ties at its local
    id 1 (global 1 must win); the max only on the last rank (at its local id 2); a tie between rank 0's
    id 3 and the last rank's first id (3 must win).
    """
    rank, tp = dist.get_rank(), dist.get_world_size()
    crafted = torch.zeros(3, 4)
    crafted[0, 1] = 5.0
    crafted[1, 2] = 7.0 if rank == tp - 1 else 1.0
    crafted[2, 3 if rank == 0 else 0] = 2.0 if rank in (0, tp - 1) else 1.0
    ties = greedy_token(crafted, 4 * rank).tolist()
    results = []
    for path, also_bf16 in cases:
        model = torch_impl.from_pretrained(path, group=dist.group.WORLD)
        v, group, out = model.spec.vocab_size, model.group, {}
        real = min(max(v - model.layout.vocab_start, 0), model.layout.vocab_shard)  # this shard's real rows
        weights = list(model.parameters())  # de-duplicated: a tied head is not a second tensor
        out["tied_is_embedding"] = model.lm_head.weight is model.model.embed_tokens.weight
        out["n_vocab_tensors"] = sum(p.shape[0] == model.layout.vocab_shard for p in weights)
        out["embed_shape"] = tuple(model.model.embed_tokens.weight.shape)
        out["numel"] = sum(p.numel() for p in weights)
        with torch.inference_mode():
            local = model(IDS, attention_mask=MASK)
            out["local_logits_shape"] = tuple(local.shape)
            out["n_padding"] = local.shape[-1] - real
            out["padding_is_neg_inf"] = bool(torch.isneginf(local[..., real:]).all())
            out["logits"] = gather_logits(local, v, group).numpy()
            with ShapeRecorder() as greedy:
                out["tokens"] = torch_impl.generate(model, PROMPTS, NEW_TOKENS, eos_token_ids=()).tokens
            out["greedy_full_vocab"] = greedy.at_least(v)
            out["greedy_ops"] = len(greedy.shapes)
            with ShapeRecorder() as control:  # the detector must see the explicit gather
                gather_logits(local[:, -1], v, group)
            out["control_full_vocab"] = control.at_least(v)
            sampled = torch_impl.generate(model, PROMPTS, NEW_TOKENS, eos_token_ids=(), return_logits=True, **SAMPLING)
            out["sampled"], out["sampled_logits"] = sampled.tokens, sampled.logits
            for bad in (v, model.layout.padded_vocab - 1, -1):  # past V (some inside the padding), negative
                try:
                    model([[1, bad]])
                    out.setdefault("bad_ids", []).append(None)
                except InputError as err:
                    out.setdefault("bad_ids", []).append(str(err))
        if also_bf16:
            model = torch_impl.from_pretrained(path, "bfloat16", group=dist.group.WORLD)
            with torch.inference_mode():
                out["logits_bf16"] = gather_logits(model(IDS, attention_mask=MASK), v, group).float().numpy()
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, out)
        results.append(gathered)
    return results, ties


def _reference(path) -> dict:
    model = torch_impl.from_pretrained(path)
    with torch.inference_mode():
        logits = model(IDS, attention_mask=MASK).numpy()
    sampled = torch_impl.generate(model, PROMPTS, NEW_TOKENS, eos_token_ids=(), return_logits=True, **SAMPLING)
    greedy = torch_impl.generate(model, PROMPTS, NEW_TOKENS, eos_token_ids=(), return_logits=True)
    return {
        "logits": logits,
        "tokens": greedy.tokens,
        "greedy_logits": greedy.logits,
        "sampled": sampled.tokens,
        "sampled_logits": sampled.logits,
        "numel": spec.parameter_count(model.spec),
        "bf16": torch_impl.from_pretrained(path, "bfloat16")(IDS, attention_mask=MASK).float().detach().numpy(),
    }


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| relative to max |b|."""
    return float(np.abs(a - b).max() / np.abs(b).max())


def _assert_sharded_matches_unsharded(results: list[list[dict]], ties: list[int], paths, tp: int) -> None:
    """`_rank_checks`' results: the sharded logits, greedy and sampled tokens, padding and shards as the unsharded
    model's, for each checkpoint."""
    assert ties == [1, 4 * (tp - 1) + 2, 3]
    for (path, also_bf16), ranks in zip(paths, results, strict=True):
        ref, s = _reference(path), ModelSpec.from_pretrained(path)
        padded = -(-s.vocab_size // tp) * tp
        assert padded != s.vocab_size  # both checkpoints exercise the vocabulary padding
        assert sum(out["n_padding"] for out in ranks) == padded - s.vocab_size
        assert all(out["padding_is_neg_inf"] for out in ranks)
        for rank, out in enumerate(ranks):
            where = f"{path} tp={tp} rank {rank}"
            assert out["local_logits_shape"] == (*IDS.shape, padded // tp), where
            assert out["embed_shape"] == (padded // tp, s.hidden_size), where
            # Tied: one vocabulary tensor per shard, the head is the embedding; untied: embedding + head.
            assert out["tied_is_embedding"] is s.tie_word_embeddings, where
            assert out["n_vocab_tensors"] == (1 if s.tie_word_embeddings else 2), where
            assert _rel(out["logits"], ref["logits"]) <= 1e-5, where
            ties = assert_same_greedy({"unsharded": ref["tokens"], where: out["tokens"]}, ref["greedy_logits"])
            print(*ties)  # near-ties are reported, not hidden (tests/greedy.py)
            assert out["greedy_ops"] > 100 and out["greedy_full_vocab"] == [], where
            assert out["control_full_vocab"], where  # the recorder does see a [B, V] tensor when one exists
            assert out["sampled"] == ref["sampled"], where  # same seed, same gathered logits, same draws
            for step, (got, want) in enumerate(zip(out["sampled_logits"], ref["sampled_logits"], strict=True)):
                assert got.shape == want.shape and _rel(got, want) <= 1e-5, (where, step)
            assert all(err and "outside the vocabulary" in err for err in out["bad_ids"]), (where, out["bad_ids"])
            if also_bf16:  # partial sums reduced in fp32: as close as two bf16 runs get
                assert _rel(out["logits_bf16"], ref["bf16"]) <= 3e-2, where
        # Shards partition the model: only replicated tensors (norms, kv heads beyond n_kv) count twice.
        assert sum(out["numel"] for out in ranks) >= ref["numel"]


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


def _grad_checks(path: str) -> dict:
    """On every rank: the loss and gradients of the sharded model, recording every tensor the step touches."""
    from torch_impl.training import loss, loss_and_grads

    model = torch_impl.from_pretrained(path, group=dist.group.WORLD)
    sizes = (model.spec.vocab_size, model.layout.padded_vocab)
    with ShapeRecorder() as record:  # the forward, the loss and the backward (not the final gather of results)
        model.requires_grad_(True)
        loss(model, IDS, attention_mask=MASK).backward()
        model.requires_grad_(False)
    with torch.inference_mode(), ShapeRecorder() as control:  # the detector does see an explicit gather
        gather_logits(model(IDS, attention_mask=MASK), model.spec.vocab_size, model.group)
    value, grads = loss_and_grads(model, IDS, attention_mask=MASK)
    return {
        "loss": value,
        "grads": grads,
        "full_vocab": record.vocabulary_sized(*sizes),
        "control": control.vocabulary_sized(*sizes),
        "ops": len(record.shapes),
    }


def _assert_gradients_match(out: dict, path: str, tp: int) -> None:
    """The vocabulary-parallel loss: never a full-vocabulary tensor on any rank, same loss and gradients."""
    from torch_impl.training import loss_and_grads

    ref_loss, ref = loss_and_grads(torch_impl.from_pretrained(path), IDS, attention_mask=MASK)
    assert out["ops"] > 100 and out["full_vocab"] == [], out["full_vocab"][:5]
    assert out["control"]  # a [B, T, V] gather would have been seen
    assert abs(out["loss"] - ref_loss) <= 1e-6 * ref_loss
    assert set(out["grads"]) == set(ref)
    for name in ref:
        assert _rel(out["grads"][name], ref[name]) <= 1e-5 * np.sqrt(3), (path, tp, name)


STEPS = 3


def _train_checks(path: str, batches: list[np.ndarray], config) -> dict:
    """On every rank: the clipping norm of one backward, then `STEPS` AdamW steps, the parameters put together,
    and every rank's copy of the tensors several ranks hold (norms, replicated kv heads), which must stay equal."""
    from torch_impl import optimizer as opt
    from torch_impl import training

    model = torch_impl.from_pretrained(path, group=dist.group.WORLD)
    model.requires_grad_(True)
    training.loss(model, batches[0], attention_mask=MASK).backward()
    opt.sum_replicated_blocks(model)
    norm = float(opt.clip_grad_norm(model, 1e9))  # coefficient 1: the norm alone
    model.zero_grad(set_to_none=True)
    optimizer = training.make_optimizer(model, config)
    losses = [training.train_step(model, optimizer, config, ids, attention_mask=MASK) for ids in batches]
    held = ("k_proj", "v_proj", "norm")  # kv heads (replicated at this degree), norms (whole on every rank)
    copies = {name: p.detach().numpy().copy() for name, p in model.named_parameters() if any(h in name for h in held)}
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, copies)
    return {"norm": norm, "losses": losses, "after": training.parameters(model), "copies": every}


def _all_rank_checks(cases: list[tuple[str, bool]], path: str, batches: list[np.ndarray], config) -> dict:
    """On every rank: `_rank_checks` of `cases`, then `_grad_checks` of `path` and `_train_checks` on a fresh copy of
    it: one launch of the ranks per degree (a launch is `tp` processes importing torch, ~5-10 s of CI each)."""
    forward, ties = _rank_checks(cases)
    return {
        "forward": forward,
        "ties": ties,
        "grads": _grad_checks(path),
        "train": _train_checks(path, batches, config),
    }


# the gradient and step checkpoint per degree: both replicate kv heads; q/k norms, bias
@pytest.mark.parametrize(("tp", "which"), [(2, "qwen2"), (4, "default")])
def test_sharded_matches_unsharded(tp, which, default_dir, qwen2_dir):
    """Forward (`_assert_sharded_matches_unsharded`: the default checkpoint, in bfloat16 too at tp 2, and the
    untied Qwen2 one), the loss and gradients (`_assert_gradients_match`), then train_step on a tensor-parallel
    model: the replicated kv heads' gradient summed over their holders, the clipping norm over every rank's slices
    with each element once, AdamW per shard; the parameters after `STEPS` steps agree with the unsharded model's
    within the step table, and the replicas stay identical."""
    from spec.training import AdamW

    paths = [(str(default_dir), tp == 2), (str(qwen2_dir), False)]
    path = str(default_dir if which == "default" else qwen2_dir)
    rng = np.random.default_rng(1)
    vocab = ModelSpec.from_pretrained(path).vocab_size
    batches = [IDS] + [rng.integers(0, vocab, IDS.shape) for _ in range(STEPS - 1)]
    config = AdamW(lr=1e-3, max_grad_norm=0.5)
    out = run_tp(_all_rank_checks, tp, paths, path, batches, config)
    _assert_sharded_matches_unsharded(out["forward"], out["ties"], paths, tp)
    _assert_gradients_match(out["grads"], path, tp)
    _assert_steps_match(out["train"], path, tp, batches, config)


def _assert_steps_match(out: dict, path: str, tp: int, batches: list[np.ndarray], config) -> None:
    """`_train_checks`' results against the same steps on the unsharded model (the test's docstring says what)."""
    from parity.gradients import compare_steps
    from torch_impl import training

    ref = torch_impl.from_pretrained(path)
    ref.requires_grad_(True)
    training.loss(ref, IDS, attention_mask=MASK).backward()
    ref_norm = float(torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 1e9))
    assert abs(out["norm"] - ref_norm) <= 1e-6 * ref_norm, (out["norm"], ref_norm)
    assert ref_norm > config.max_grad_norm  # the steps below clip
    ref.zero_grad(set_to_none=True)
    before = training.parameters(ref)
    optimizer = training.make_optimizer(ref, config)
    ref_losses = [training.train_step(ref, optimizer, config, ids, attention_mask=MASK) for ids in batches]
    after = training.parameters(ref)

    np.testing.assert_allclose(out["losses"], ref_losses, rtol=1e-6)
    assert set(out["after"]) == set(after)
    model_spec = ref.spec  # the checkpoint's, as loaded
    sharded, unsharded = (out["losses"], None, out["after"]), (ref_losses, None, after)
    steps = compare_steps(sharded, unsharded, before, (f"torch/tp{tp}", "torch"), "float32", model_spec)
    assert steps.passed and len(steps.update_rms_rel) > 20, steps.to_dict()  # the step table, key bias left out
    n_kv = model_spec.num_key_value_heads
    assert n_kv < tp  # each kv head on tp / n_kv ranks
    holders: dict[tuple[str, int], list[np.ndarray]] = {}
    for rank, copies in enumerate(out["copies"]):
        for name, value in copies.items():
            block = rank * n_kv // tp if ("k_proj" in name or "v_proj" in name) else 0
            holders.setdefault((name, block), []).append(value)
    for (name, block), values in holders.items():
        assert len(values) > 1
        for value in values[1:]:
            assert np.array_equal(value, values[0]), (name, block)
