"""Training both backends must share (torch_impl/training.py, jax_impl/training.py): the loss's known answers
and conventions, gradients by checkpoint name, AdamW's arithmetic, and the refusals of bad input.

One body for both twins: tests/torch_impl/test_training.py and tests/jax_impl/test_training.py subclass
`TrainingTwin`; the cross-framework and transformers comparisons are in tests/parity/test_grad.py.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, ClassVar

import numpy as np
import pytest

import spec
from spec import InputError
from spec.training import AdamW
from tests.backends import load, to_numpy

IDS = np.array([[5, 9, 200, 17, 33, 101, 7], [1, 2, 3, 4, 5, 6, 7]])


class TrainingTwin:
    backend: ClassVar[str]  # "torch" | "jax"

    @property
    def training(self):
        return importlib.import_module(f"{self.backend}_impl.training")

    def as_array(self, a: np.ndarray) -> Any:
        if self.backend == "torch":
            import torch

            return torch.as_tensor(a)
        import jax.numpy as jnp

        return jnp.asarray(a)

    @pytest.fixture(scope="class")
    def model(self, default_dir):
        return load(self.backend, default_dir)

    def test_cross_entropy_known_answer(self):
        """Two positions predict; uniform logits over V = 4 give log 4, a sure hit gives ~0; the mean is half."""
        logits = np.zeros((1, 3, 4), np.float32)
        logits[0, 1] = [0.0, 0.0, 50.0, 0.0]  # position 1 predicts label 2 (labels[0, 2])
        labels = np.array([[0, 3, 2]])
        value = float(to_numpy(self.training.cross_entropy(self.as_array(logits), self.as_array(labels))))
        assert value == pytest.approx((math.log(4) + 0.0) / 2, rel=1e-6)

    def test_cross_entropy_ignores_minus_100_and_counts_the_rest(self):
        rng = np.random.default_rng(0)
        logits = rng.standard_normal((2, 5, 11)).astype(np.float32)  # odd vocabulary
        labels = rng.integers(0, 11, (2, 5))
        labels[0, 2] = labels[1, 4] = -100
        x = logits[:, :-1].reshape(-1, 11).astype(np.float64)
        target = labels[:, 1:].reshape(-1)
        keep = target != -100
        lse = np.log(np.exp(x).sum(-1))
        want = (lse - x[np.arange(len(target)), np.maximum(target, 0)])[keep].mean()
        got = float(to_numpy(self.training.cross_entropy(self.as_array(logits), self.as_array(labels))))
        assert got == pytest.approx(want, rel=1e-6)

    def test_grads_keyed_by_checkpoint_name_in_checkpoint_layout(self, model, default_dir):
        loss, grads = self.training.loss_and_grads(model, IDS)
        checkpoint = spec.Checkpoint(default_dir)
        table = spec.param_table(model.spec)
        assert set(grads) == {e.name for e in table}  # tied: no lm_head.weight, gate and up split back
        for entry in table:
            assert grads[entry.name].shape == checkpoint.shape(entry.name), entry.name
            assert grads[entry.name].dtype == np.float32 and np.isfinite(grads[entry.name]).all()
        assert np.isfinite(loss) and loss > 0

    def test_padding_is_neither_predicted_nor_predicting(self, model):
        """A left-padded row gives the loss of its real tokens alone: pad ids change nothing."""
        mask = np.ones_like(IDS)
        mask[0, :3] = 0
        padded = IDS.copy()
        other = padded.copy()
        other[0, :3] = [250, 251, 252]  # different pad ids, same mask
        a, ga = self.training.loss_and_grads(model, padded, attention_mask=mask)
        b, gb = self.training.loss_and_grads(model, other, attention_mask=mask)
        assert a == pytest.approx(b, rel=1e-6)
        for name in ga:
            assert np.abs(ga[name] - gb[name]).max() <= 1e-5 * np.abs(ga[name]).max() + 1e-12, name

    def test_tied_table_gradient_holds_both_uses(self, model):
        """Rows of ids that never appear still get the head's gradient; rows that appear get both."""
        _, grads = self.training.loss_and_grads(model, IDS)
        table = grads["model.embed_tokens.weight"]
        unused = sorted(set(range(model.spec.vocab_size)) - set(IDS.ravel().tolist()))
        assert np.abs(table[unused]).max() > 0  # the head's share (softmax over every row)

    def test_steps_reduce_the_loss_on_a_repeated_batch(self, default_dir):
        model = load(self.backend, default_dir)
        config = AdamW(lr=1e-2)
        optimizer = self.training.make_optimizer(model, config)
        losses = [self.training.train_step(model, optimizer, config, IDS) for _ in range(5)]
        assert losses[-1] < 0.5 * losses[0], losses

    @pytest.mark.parametrize(
        ("ids", "mask", "needle"),
        [
            (IDS, np.where(np.eye(2, 7, dtype=bool), 2, 1), r"attention_mask\[0, 0\] = 2: a mask holds only 0 and 1"),
            (IDS, np.full(IDS.shape, 0.5), "attention_mask must hold 0/1 .integer or bool., got dtype float64"),
            (IDS, np.stack([np.ones(7, int), np.zeros(7, int)]), "attention_mask row 1 is all zeros"),
            (IDS, np.ones((2, 5), int), r"attention_mask has shape \[2, 5\], expected \[2, 7\]"),
            (IDS, np.ones(7, int), r"attention_mask has shape \[7\], expected \[2, 7\]"),
            (IDS[0], None, r"input_ids must have shape \[batch, seq_len\], got rank 1"),
            (IDS.astype(np.float32), None, "input_ids must hold integer token ids, got dtype float32"),
            (np.where(IDS == 200, 300, IDS), None, r"input_ids\[0, 2\] = 300 is outside the vocabulary \[0, 263\)"),
            (IDS[:, :1], None, r"a next-token loss needs at least 2 tokens per row, got input_ids of shape \[2, 1\]"),
            ([list(IDS[0]), list(IDS[1, :5])], None, "input_ids must be a rectangular array"),
        ],
        ids=[
            "mask-2",
            "mask-float",
            "mask-empty-row",
            "mask-shape",
            "mask-1d",
            "ids-1d",
            "ids-float",
            "id-300",
            "one",
            "ids-ragged",
        ],  # fmt: skip
    )
    def test_bad_ids_and_masks_are_refused_before_the_labels(self, model, ids, mask, needle):
        with pytest.raises(InputError, match=needle):
            self.training.loss_and_grads(model, ids, attention_mask=mask)

    def test_bad_labels_are_refused(self, model):
        with pytest.raises(InputError, match=r"labels have shape \[2, 6\], the ids \[2, 7\]"):
            self.training.loss_and_grads(model, IDS, labels=IDS[:, :6])
        bad = IDS.copy()
        bad[1, 3] = model.spec.vocab_size
        with pytest.raises(InputError, match=r"label 263 at \[1, 3\] is outside the vocabulary"):
            self.training.loss_and_grads(model, IDS, labels=bad)
        with pytest.raises(InputError, match="no token is counted"):
            self.training.loss_and_grads(model, IDS, labels=np.full_like(IDS, -100))
        with pytest.raises(InputError, match="labels must be integers"):
            self.training.loss_and_grads(model, IDS, labels=IDS.astype(np.float32))
        ragged = [list(IDS[0]), list(IDS[1, :5])]  # numpy's own error for these, before: not an InputError
        with pytest.raises(InputError, match="labels must be a rectangular array"):
            self.training.loss_and_grads(model, IDS, labels=ragged)
