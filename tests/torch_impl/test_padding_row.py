"""torch_impl's embedding padding row: the behaviour both twins share (tests/twins/padding_row.py), then tensor
parallelism: two gloo ranks' gradients equal unsharded ones on ids with the pad id, the pad row on rank 1
(the tied default shape, pad 200 of V = 263) and on rank 0 (OLMo 2, untied, pad 1)."""

from __future__ import annotations

import numpy as np
import torch.distributed as dist

import torch_impl
from tests.backends import rel_err
from tests.twins.padding_row import EMBED, IDS, PAD, PaddingRowTwin, hf_ids, write_pad_checkpoints


class TestPaddingRowTwin(PaddingRowTwin):
    backend = "torch"


def _sharded_grads(cases: list[tuple[str, np.ndarray]]) -> list[tuple[float, dict]]:
    from torch_impl.training import loss_and_grads

    return [loss_and_grads(torch_impl.from_pretrained(path, group=dist.group.WORLD), ids) for path, ids in cases]


def test_tensor_parallel_gradients_equal_unsharded_with_pad_ids(tmp_path, hf_checkpoint):
    from torch_impl.tp_launch import run_tp
    from torch_impl.training import loss_and_grads

    cases = [
        (str(write_pad_checkpoints(tmp_path)["tied"]), IDS),
        (str(hf_checkpoint("olmo2_post")), hf_ids("olmo2_post")),
    ]
    sharded = run_tp(_sharded_grads, 2, cases)
    for (path, ids), pad, (tp_loss, tp_grads) in zip(cases, (PAD, 1), sharded, strict=True):
        model = torch_impl.from_pretrained(path)
        loss, grads = loss_and_grads(model, ids)
        assert abs(tp_loss - loss) <= 1e-6 * loss, path
        assert set(tp_grads) == set(grads), path
        bound = 1e-5 * np.sqrt(1 + model.spec.num_hidden_layers)
        for key in grads:
            assert rel_err(tp_grads[key], grads[key]) <= bound, (path, key)
        scale = np.abs(grads[EMBED]).max()
        np.testing.assert_allclose(tp_grads[EMBED][pad], grads[EMBED][pad], rtol=0, atol=bound * scale)
        if not model.spec.tie_word_embeddings:
            assert not tp_grads[EMBED][pad].any()  # the rank holding the row gives it nothing
