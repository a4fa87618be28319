"""torch_impl.training: the training behaviour both twins share (tests/twins/training.py)."""

from __future__ import annotations

from tests.twins.training import TrainingTwin


class TestTrainingTwin(TrainingTwin):
    backend = "torch"


def test_inference_tensors_cannot_take_a_gradient(default_dir):
    import numpy as np
    import pytest
    import torch

    import torch_impl
    from spec import InputError
    from torch_impl import training

    with torch.inference_mode():
        model = torch_impl.from_pretrained(default_dir)
    with pytest.raises(InputError, match="inference_mode"):
        training.loss_and_grads(model, np.array([[1, 2, 3]]))


def test_loss_keeps_no_second_float32_logits_copy():
    """The saved tensors of the loss are the logits themselves plus per-row vectors, nothing [N, V]-sized."""
    import torch

    from torch_impl.training import cross_entropy

    logits = torch.randn(2, 9, 301, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 301, (2, 9))
    loss = cross_entropy(logits, labels)
    saved = loss.grad_fn.saved_tensors
    big = [t for t in saved if t.numel() >= 301 * 18]
    assert len(big) == 1 and big[0].dtype == torch.bfloat16  # the logits, in their own dtype
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16


def test_train_step_tied_table_gradient_is_autograds(tmp_path):
    """train_step adds the looked-up rows' gradients into the tied head's gradient itself (torch_impl/training.py);
    the result is autograd's gradient of the table (loss_and_grads), pad row and repeated ids included."""
    import numpy as np

    from spec.training import AdamW
    from tests.backends import load
    from tests.twins.padding_row import EMBED, IDS, PAD, write_pad_checkpoints
    from torch_impl import training

    model = load("torch", write_pad_checkpoints(tmp_path)["tied"])
    _, grads = training.loss_and_grads(model, IDS)
    config = AdamW(lr=1e-3, max_grad_norm=None)  # clipping would scale .grad in place
    training.train_step(model, training.make_optimizer(model, config), config, IDS)
    embed = model.model.embed_tokens
    got = embed.weight.grad.numpy()
    scale = np.abs(grads[EMBED]).max()
    assert np.abs(got - grads[EMBED]).max() <= 1e-6 * scale  # float32: only the order of a few row sums differs
    assert np.abs(got[PAD] - grads[EMBED][PAD]).max() <= 1e-6 * scale  # the head's use of the pad row alone
    assert not embed._forward_hooks  # the lookup is back in the graph for the next caller
