"""Tensor parallelism (torch_impl/tensor_parallel.py, vocab_parallel.py, tp_launch.py) on 2 and 4 gloo processes.

The slicing itself (spec/parallel.py, the partition table) is tested in tests/spec/test_parallel.py.

Spawning a process group costs seconds on a small CPU, so each degree spawns once and one worker runs
every check on every rank (`_rank_checks`, tests/torch_impl/tp_rank_checks.py), returning plain data that the
test asserts on. Two
checkpoints: the built-in default (Qwen3, tied, 4 heads / 2 kv heads, V=263: padded at tp 2 and 4, kv
heads split at tp 2 and replicated at tp 4) and an untied Qwen2 with q/k/v bias and a single kv head.
Both have a vocabulary larger than every other dimension a greedy step touches, so "no process holds
a full-vocabulary tensor" can be checked as "no tensor has a dimension >= V". The launcher's own tests (a bad
degree, a rank's error, settings handed to the ranks, the CLI entry point): test_tensor_parallel_launch.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spec
import torch_impl
from spec import ModelSpec
from tests.greedy import assert_same_greedy
from tests.specs import QWEN2_SINGLE_KV
from tests.torch_impl.tp_rank_checks import IDS, MASK, NEW_TOKENS, PROMPTS, SAMPLING, STEPS, all_rank_checks
from torch_impl.tp_launch import run_tp

QWEN2_SPEC = QWEN2_SINGLE_KV  # untied, biased, one kv head: padded vocabulary, replicated kv heads


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return spec.write_checkpoint(tmp_path_factory.mktemp("qwen2"), QWEN2_SPEC, spec.random_weights(QWEN2_SPEC, 1))


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
    out = run_tp(all_rank_checks, tp, paths, path, batches, config)
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
