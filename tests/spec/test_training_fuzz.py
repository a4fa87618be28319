"""Property-based tests of a training batch at its boundaries, through both backends' `loss_and_grads`
(spec/training.py's `check_labels` validates for both): labels with ignored (-100) and hostile entries, masks with
padding on either side, values other than 0 and 1, rows of padding only, ids that are ragged or outside the
vocabulary. Each batch is refused by both backends with the same InputError, or gives both the same float32 loss.
The loss is where a port's masking conventions (which positions predict, which are predicted) show;
tests/spec/test_requests_fuzz.py does the same for generation and the forward.

Drawn with a fixed seed (`derandomize`), so that CI runs the same batches on every machine: 60 batches of one or two
shapes, so jax_impl compiles its loss and gradients about twice; a few seconds in all. Its first run found
torch_impl reading ids with numpy's bare `asarray` (ragged rows raised numpy's ValueError); both now check them first.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spec import DEFAULT_SPEC
from tests.backends import BACKENDS, both_outcomes, load

SETTINGS = dict(
    deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
V = DEFAULT_SPEC.vocab_size
SHAPE = (2, 7)
LOSS_REL = 1e-6  # float32 losses of the two backends: tests/parity/test_grad.py's bound (measured there <= 1.2e-7)


@pytest.fixture(scope="module")
def losses(default_dir) -> dict[str, Any]:
    """{backend: the loss its training.loss_and_grads gives over the default checkpoint (an InputError escapes)}."""

    def loss_of(backend: str):
        model, training = load(backend, default_dir), importlib.import_module(f"{backend}_impl.training")
        return lambda *args, **kwargs: training.loss_and_grads(model, *args, **kwargs)[0]

    return {backend: loss_of(backend) for backend in BACKENDS}


@st.composite
def batches(draw) -> tuple[Any, dict[str, Any]]:
    rows, cols = draw(st.sampled_from([SHAPE] * 4 + [(1, 5), (1, 1)]))
    ids = np.array(draw(st.lists(st.lists(st.integers(0, V - 1), min_size=cols, max_size=cols), min_size=rows,
                                 max_size=rows)))  # fmt: skip
    kwargs: dict[str, Any] = {}
    if draw(st.integers(0, 5)) == 0:  # hostile ids: one outside the vocabulary, or a ragged list
        ids = [list(ids[0]), list(ids[-1][:-1])] if draw(st.booleans()) else np.where(ids == ids[0, 0], V, ids)
    if draw(st.booleans()):
        labels = np.array(ids, copy=True) if isinstance(ids, np.ndarray) else np.zeros((rows, cols), np.int64)
        ignored = draw(st.lists(st.booleans(), min_size=labels.size, max_size=labels.size))
        labels[np.array(ignored).reshape(labels.shape)] = -100
        if draw(st.integers(0, 5)) == 0:
            labels.flat[draw(st.integers(0, labels.size - 1))] = draw(st.sampled_from([V, -1, -101]))
        kwargs["labels"] = labels
    if draw(st.booleans()):
        mask = np.ones((rows, cols), np.int64)
        for row in range(rows):
            pad = draw(st.integers(0, cols))
            side = draw(st.sampled_from(["left", "right"]))
            if pad:
                mask[row, :pad] = 0 if side == "left" else 1
                if side == "right":
                    mask[row, cols - pad :] = 0
        if draw(st.integers(0, 7)) == 0:
            mask.flat[0] = 2
        kwargs["attention_mask"] = mask
    return ids, kwargs


@settings(max_examples=60, **SETTINGS)
@given(batch=batches())
def test_both_backends_refuse_or_agree_on_every_batch(losses, batch):
    ids, kwargs = batch
    kind, torch_loss, jax_loss = both_outcomes(lambda backend: losses[backend](ids, **kwargs))
    event(kind if kind == "ran" else torch_loss.split(" ")[0])
    if kind == "refused":
        return
    assert np.isfinite(torch_loss) and abs(torch_loss - jax_loss) <= LOSS_REL * abs(torch_loss), (torch_loss, jax_loss)
