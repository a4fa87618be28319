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
