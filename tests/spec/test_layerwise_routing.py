"""Both backends' layer-streamed pieces (torch_impl/layerwise.py, jax_impl/layerwise.py) take a layer's teacher-forced
routing alike: one entry per input, refused with the same words when it is not (spec.layerwise.check_layer_call),
each entry checked as a whole model checks it (spec.inputs.check_routing), and the same forced experts recorded."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from tests.backends import both_outcomes, to_numpy
from tests.hf_configs import MOE_CONFIGS

pytest.importorskip("transformers")

NAME = "qwen3_moe_e6k4"  # layers 0 and 2 sparse, layer 1 dense; 6 experts, 4 per token
IDS = np.random.default_rng(3).integers(0, MOE_CONFIGS[NAME]["vocab_size"], (2, 7))
# The backends' own choices are compared exactly: on these ids every token's 4th and 5th router logits lie at least
# 0.05 apart (layer 0; 0.18 in layer 2) at a scale of 2.4-2.6, where float32 reorderings move them by ~1e-6, so no
# processor's summation order can flip one.


def pieces(backend: str, directory):
    """The backend's Layerwise over the checkpoint at `directory`."""
    return importlib.import_module(f"{backend}_impl.layerwise").Layerwise(directory)


def streamed_layer(backend: str, directory, layer: int, routing) -> np.ndarray:
    """Layers 0 .. `layer` streamed on IDS, `routing` given to the last: its forced (or own) expert ids."""
    layerwise = pieces(backend, directory)
    trace: dict = {}
    boundary = [layerwise.embed(IDS, trace)]
    for i in range(layer + 1):
        boundary = layerwise.run_layer(i, boundary, [trace], routing=routing if i == layer else None)
    return to_numpy(trace[f"layers.{layer}.moe.topk_ids"])


FORCED = np.tile([5, 0, 3, 1], (2, 7, 1))
CASES = {
    "one entry forced": (2, [FORCED]),
    "an entry of None": (2, [None]),
    "a dict, the whole model's form": (2, {2: FORCED}),
    "one array, not a list of them": (0, FORCED),
    "a string": (0, "x"),
    "two entries for one input": (2, [FORCED, FORCED]),
    "no entries": (2, []),
    "an id out of range": (2, [np.full((2, 7, 4), 6)]),
    "a repeated expert": (0, [np.tile([1, 1, 2, 3], (2, 7, 1))]),
    "the wrong k": (2, [FORCED[..., :3]]),
    "a dense layer": (1, [FORCED]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_streamed_routing_is_taken_or_refused_alike(case, hf_checkpoint):
    directory = hf_checkpoint(NAME)
    layer, routing = CASES[case]
    if layer == 1:  # a dense layer records no expert choice: only its refusal is compared

        def call(backend: str):
            layerwise = pieces(backend, directory)
            boundary = layerwise.run_layer(0, [layerwise.embed(IDS)], [None])
            return layerwise.run_layer(1, boundary, [None], routing=routing)

        outcome, torch_out, jax_out = both_outcomes(call)
        assert outcome == "refused", "a dense layer took teacher-forced routing"
        assert "routing given for layer 1, which is not a sparse layer" in torch_out
        return
    outcome, torch_ids, jax_ids = both_outcomes(lambda backend: streamed_layer(backend, directory, layer, routing))
    if case in ("one entry forced", "an entry of None"):
        assert outcome == "ran"
        np.testing.assert_array_equal(torch_ids, jax_ids)
        if case == "one entry forced":
            np.testing.assert_array_equal(torch_ids, FORCED)
    else:
        assert outcome == "refused", f"{case}: both backends ran"
