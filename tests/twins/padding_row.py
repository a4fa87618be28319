"""The embedding's padding row (docs/design.md, "Training"): the lookup gives row pad_token_id no gradient, as
transformers' nn.Embedding(padding_idx=pad_token_id) does; a tied head's use of the table still trains it.

One body for both twins: tests/torch_impl/test_padding_row.py and tests/jax_impl/test_padding_row.py subclass
`PaddingRowTwin`; the tensor-parallel cases are there. The checkpoints: the default Qwen3 shape with
pad_token_id 200 (not a family default; on the second of two vocabulary shards), tied, and the same weights
untied with the head a copy of the table, so that the untied head's gradient is the tied table's head use,
computed by another graph. Against transformers: Gemma 2 (tied, pad 0 by default) and OLMo 2 (untied, pad 1).
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import spec
from tests.backends import load, rel_err, run, to_numpy
from tests.hf_configs import FAMILY_CONFIGS

PAD = 200
PAD_SPEC = dataclasses.replace(spec.DEFAULT_SPEC, pad_token_id=PAD)
# the pad id as input and as label, at the first position, in the middle and last
IDS = np.array([[PAD, 5, PAD, 17, 33, PAD, 7, 250], [1, 2, PAD, 4, 5, 6, 7, PAD]])
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
HF_CASES = {"gemma2_sandwich": 0, "olmo2_post": 1}  # transformers' config defaults (Gemma2Config, Olmo2Config)


def write_pad_checkpoints(root: Path) -> dict[str, Path]:
    """{"tied": ..., "untied": ...}: the same weights, the untied head a copy of the embedding table."""
    weights = spec.random_weights(PAD_SPEC, seed=3)
    untied = dataclasses.replace(PAD_SPEC, tie_word_embeddings=False)
    return {
        "tied": spec.write_checkpoint(root / "tied", PAD_SPEC, weights),
        "untied": spec.write_checkpoint(root / "untied", untied, {**weights, HEAD: weights[EMBED].copy()}),
    }


def hf_ids(name: str) -> np.ndarray:
    """Random ids of the family's vocabulary with its pad id at four places, as input and as label."""
    ids = np.random.default_rng(2).integers(0, FAMILY_CONFIGS[name]["vocab_size"], (2, 12))
    ids[0, [0, 4]] = ids[1, [6, 11]] = HF_CASES[name]
    return ids


class PaddingRowTwin:
    backend: ClassVar[str]  # "torch" | "jax"

    @property
    def training(self):
        return importlib.import_module(f"{self.backend}_impl.training")

    @pytest.fixture(scope="class")
    def dirs(self, tmp_path_factory):
        return write_pad_checkpoints(tmp_path_factory.mktemp("padding_row"))

    @pytest.fixture(scope="class")
    def untied(self, dirs):
        model = load(self.backend, dirs["untied"])
        assert model.spec.pad_token_id == PAD  # read back from the written config.json
        return model, self.training.loss_and_grads(model, IDS)

    def test_untied_pad_row_gets_no_gradient_from_the_lookup(self, untied):
        _, (_, grads) = untied
        embed = grads[EMBED]
        assert not embed[PAD].any()  # exactly zero, though the id is looked up at four predicting positions
        predicting = IDS[:, :-1]  # the last position's input reaches no counted logit
        assert np.abs(embed[np.unique(predicting[predicting != PAD])]).max(axis=-1).all()  # the other rows train
        assert np.abs(grads[HEAD][PAD]).max() > 0  # the pad id is a label: the head's row is trained

    def test_forward_is_unchanged(self, untied):
        """The pad positions' embedding is the table's row itself: only the backward changes."""
        model, _ = untied
        trace: dict = {}
        run(model, IDS, trace=trace)
        table = spec.random_weights(PAD_SPEC, seed=3)[EMBED]
        embed = to_numpy(trace["embed"])  # [B, T, H]
        np.testing.assert_array_equal(embed[IDS == PAD], np.broadcast_to(table[PAD], (5, table.shape[1])))

    def test_tied_pad_row_holds_the_head_gradient_only(self, dirs, untied):
        """Tied: row PAD's gradient is the head's use alone, i.e. the untied head's row PAD (another graph on the
        same weights and forward); every other row is the sum of the untied table's and head's gradients."""
        _, (untied_loss, untied_grads) = untied
        loss, grads = self.training.loss_and_grads(load(self.backend, dirs["tied"]), IDS)
        assert HEAD not in grads and loss == pytest.approx(untied_loss, rel=1e-6)
        head_row = untied_grads[HEAD][PAD]
        assert np.abs(head_row).max() > 0
        np.testing.assert_allclose(grads[EMBED][PAD], head_row, rtol=0, atol=1e-6 * np.abs(head_row).max())
        both = untied_grads[EMBED] + untied_grads[HEAD]
        assert rel_err(grads[EMBED], both) <= 1e-5 * np.sqrt(1 + PAD_SPEC.num_hidden_layers)

    @pytest.mark.parametrize("name", list(HF_CASES))
    def test_gradients_match_transformers_with_pad_ids(self, name, hf_checkpoint):
        """transformers' own autograd (its nn.Embedding(padding_idx=pad)) on ids that include the pad id: every
        gradient within the float32 gradient bound 1e-5 * sqrt(1 + L) of the family tests."""
        from parity.hf_training import hf_loss_and_grads

        directory = hf_checkpoint(name)
        model = load(self.backend, directory)
        pad = HF_CASES[name]
        assert model.spec.pad_token_id == pad
        ids = hf_ids(name)
        ref_loss, ref = hf_loss_and_grads(directory, ids, dtype="float32")
        loss, grads = self.training.loss_and_grads(model, ids)
        assert abs(loss - ref_loss) <= 1e-6 * ref_loss
        assert set(grads) == set(ref)
        if model.spec.tie_word_embeddings:  # Gemma: the head's use alone, not zero
            assert np.abs(ref[EMBED][pad]).max() > 0
        else:  # OLMo 2: transformers' row is exactly zero, and so is ours
            assert not ref[EMBED][pad].any() and not grads[EMBED][pad].any()
        bound = 1e-5 * np.sqrt(1 + model.spec.num_hidden_layers)
        for key in ref:
            assert rel_err(grads[key], ref[key]) <= bound, key
        scale = np.abs(ref[EMBED]).max()
        np.testing.assert_allclose(grads[EMBED][pad], ref[EMBED][pad], rtol=0, atol=bound * scale)
