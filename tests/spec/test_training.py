"""spec/training.py: the one AdamW setting both backends build from, and the labels convention."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from spec import InputError
from spec.training import AdamW, backward_order, check_labels

IDS = np.array([[5, 9, 200, 17, 33, 101, 7], [1, 2, 3, 4, 5, 6, 7]])


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (dict(lr=0.0), "lr must be > 0"),
        (dict(lr=float("nan")), "lr must be a finite number"),
        (dict(beta1=1.0), r"beta1 must be in \[0, 1\)"),
        (dict(beta2=-0.1), r"beta2 must be in \[0, 1\)"),
        (dict(eps=0.0), "eps must be > 0"),
        (dict(weight_decay=-1.0), "weight_decay must be >= 0"),
        (dict(max_grad_norm=0.0), "max_grad_norm must be > 0"),
        (dict(lr=True), "lr must be a finite number"),
    ],
)
def test_bad_optimizer_settings_are_refused(setting, message):
    with pytest.raises(InputError, match=message):
        AdamW(**setting)


def test_labels_default_to_the_ids_and_mask_shifts():
    labels = check_labels(None, IDS, spec.DEFAULT_SPEC, np.array([[0, 0, 1, 1, 1, 1, 1], [1] * 7]))
    assert labels[0].tolist() == [-100, -100, -100, 17, 33, 101, 7]  # pads, and the token a pad would predict
    assert labels[1].tolist() == IDS[1].tolist()


def test_backward_order_is_the_forward_order_reversed():
    order = backward_order(spec.DEFAULT_SPEC)
    assert order[0] == "model.norm.weight" and order[-1] == "model.embed_tokens.weight"  # tied: no lm_head
    layer1 = [n.removeprefix("model.layers.1.") for n in order if n.startswith("model.layers.1.")]
    assert layer1 == [
        "mlp.down_proj.weight", "mlp.up_proj.weight", "mlp.gate_proj.weight", "post_attention_layernorm.weight",
        "self_attn.o_proj.weight", "self_attn.k_norm.weight", "self_attn.q_norm.weight", "self_attn.v_proj.weight",
        "self_attn.k_proj.weight", "self_attn.q_proj.weight", "input_layernorm.weight",
    ]  # fmt: skip
