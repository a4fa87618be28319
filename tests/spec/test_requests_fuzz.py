"""Property-based tests of a generation request at its boundaries, through both backends' `generate` and forward
(spec/generation.py and spec/inputs.py validate for both): every request drawn, hostile values included (ids outside
the vocabulary or not integers, empty or ragged rows, masks of the wrong shape or right-padded, temperatures below
float32's smallest normal, NaN, EOS ids the model cannot produce), is either refused by both backends with the same
InputError or run by both to tokens of the vocabulary, greedy ones the same up to a near-tie. Never another
exception, never one backend alone: the class of bug a boundary hunt found seven of (one backend crashing on a
one-token prompt, a request using the last position refused, bad EOS ids and temperatures let through).

Drawn with a fixed seed (`derandomize`), so that CI runs the same requests on every machine: about 100 requests, a
fifth of them run, the rest refused before anything compiles (`--hypothesis-show-statistics` counts them by the
name each refusal starts with), and 40 forwards; about 10 s in all. The first run found the backends validating in
different orders (a request with bad prompts and bad EOS ids: torch named the EOS ids, jax the prompts), now one
order for both (spec/generation.py's `check_request`), and `[]` refused as a float64 array rather than as empty.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spec import DEFAULT_SPEC
from tests.backends import BACKENDS, both_outcomes, load, package, run
from tests.greedy import assert_same_greedy

SETTINGS = dict(
    deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
V = DEFAULT_SPEC.vocab_size
MAX_POS = DEFAULT_SPEC.max_position_embeddings
# The values where a check has an edge: both ends of the vocabulary and one step past each, integers too large for
# int32, and what is not an integer id at all.
IDS = st.sampled_from([0, 1, 7, V - 1, V, -1, 2**31, 2**63 - 1, 2.0, True])
FP32_GREEDY_REL = 1e-5  # float32 logits of the two backends: tests/twins/generate.py's FP32_REL


@pytest.fixture(scope="module")
def models(default_dir) -> dict[str, Any]:
    return {backend: load(backend, default_dir) for backend in BACKENDS}


@st.composite
def prompts(draw) -> Any:
    """Ids as a caller might pass them: a rectangular array (of several dtypes), equal rows as lists, ragged rows,
    none at all; mostly valid, sometimes hostile."""
    rows = draw(st.sampled_from([1, 2, 3] * 2 + [0]))
    valid = draw(st.integers(0, 3)) > 0  # three in four: a refused prompt hides every later check
    value = st.integers(0, V - 1) if valid else IDS
    lengths = draw(st.lists(st.integers(0 if not valid else 1, 5), min_size=rows, max_size=rows))
    ragged = [draw(st.lists(value, min_size=n, max_size=n)) for n in lengths]
    kind = draw(st.sampled_from(["array", "lists", "ragged"]))
    if kind == "ragged" or not ragged:
        return ragged
    width = min(lengths)
    square = [row[:width] for row in ragged]
    if kind == "lists":
        return square
    dtype = draw(st.sampled_from([np.int64, np.int32, np.float32] if valid else [np.int64, np.float64, object]))
    return np.array(square, dtype=dtype)


@st.composite
def requests(draw) -> tuple[Any, Any, dict[str, Any]]:
    ids = draw(prompts())
    new = draw(st.sampled_from([1, 2, 3, 4] * 2 + [0, -1, 1.0, True, MAX_POS]))  # mostly valid, every edge
    kwargs: dict[str, Any] = {}
    if draw(st.booleans()) and isinstance(ids, np.ndarray) and ids.ndim == 2:
        b, t = ids.shape
        shape = draw(st.sampled_from([(b, t), (b, t + 1), (t,)]))
        mask = np.ones(shape, np.int64)
        if len(shape) == 2 and t > 1 and b:
            pad = draw(st.integers(0, t - 1))
            side = draw(st.sampled_from(["left", "right"]))
            mask[0, :pad] = 0 if side == "left" else 1
            if side == "right" and pad:
                mask[0, -pad:] = 0
        kwargs["attention_mask"] = mask
    sampling = draw(st.sampled_from(["greedy", "sampled", "hostile"]))
    if sampling == "sampled":
        kwargs.update(temperature=draw(st.sampled_from([0.7, 1.0, 2.0])), seed=draw(st.integers(0, 3)))
        kwargs["top_k"] = draw(st.sampled_from([None, 1, 5, V + 3]))
        kwargs["top_p"] = draw(st.sampled_from([None, 0.5, 1.0]))
    elif sampling == "hostile":
        kwargs.update(
            temperature=draw(st.sampled_from([-1.0, 1e-45, float("nan"), float("inf"), 0.0])),
            top_k=draw(st.sampled_from([None, 0, -1, 2.5])),
            top_p=draw(st.sampled_from([None, 0.0, 1.5, float("nan")])),
            seed=draw(st.sampled_from([0, -1, 2**64, 1.5])),
        )
    kwargs["eos_token_ids"] = draw(st.sampled_from([(), (), 3, (1, 2), None, V, -1, (0, V), "3"]))
    return ids, new, kwargs


@settings(max_examples=80, **SETTINGS)
@given(request=requests())
def test_both_backends_refuse_or_run_every_request_alike(models, request):
    ids, new, kwargs = request
    kind, torch_value, jax_value = both_outcomes(
        lambda backend: package(backend).generate(models[backend], ids, new, return_logits=True, **kwargs)
    )
    event(kind if kind == "ran" else torch_value.split(" ")[0])
    if kind == "refused":
        return
    rows = len(ids)
    for generation in (torch_value, jax_value):
        assert len(generation.tokens) == rows
        for row in generation.tokens:
            assert 1 <= len(row) <= new and all(0 <= t < V for t in row), row
    if kwargs.get("temperature", 0.0) == 0.0:
        assert_same_greedy(
            {"torch": torch_value.tokens, "jax": jax_value.tokens}, torch_value.logits, rel=FP32_GREEDY_REL
        )


@st.composite
def forwards(draw) -> tuple[Any, dict[str, Any]]:
    """Ids with the forward's other inputs, each sometimes hostile: a mask (the wrong shape, a row of padding only),
    positions (beyond the RoPE table, negative, the wrong shape, not integers), routing (a dense model has none)."""
    ids = draw(prompts())
    kwargs: dict[str, Any] = {}
    b, t = np.shape(ids) if isinstance(ids, np.ndarray) and ids.ndim == 2 else (1, 1)
    if draw(st.booleans()):
        mask = np.ones(draw(st.sampled_from([(b, t), (b, t + 1), (t,)])), np.int64)
        if mask.ndim == 2 and mask.size and draw(st.booleans()):
            mask[0] = 0
        kwargs["attention_mask"] = mask
    if draw(st.booleans()):
        value = draw(st.sampled_from([0, 3, MAX_POS - 1, MAX_POS, -1]))
        shape = draw(st.sampled_from([(b, t), (b, t + 1), (t,)]))
        kwargs["positions"] = np.full(shape, value, draw(st.sampled_from([np.int64, np.int32, np.float32])))
    if draw(st.integers(0, 2)) == 0:
        kwargs["routing"] = {0: np.zeros((b, t, 2), np.int64)}
    return ids, kwargs


@settings(max_examples=60, **SETTINGS)
@given(forward=forwards())
def test_both_forwards_refuse_or_run_the_same_inputs(models, forward):
    """A forward: refused by both with the same InputError, or logits of [B, T, V] from both that agree."""
    ids, kwargs = forward
    kind, torch_logits, jax_logits = both_outcomes(lambda backend: run(models[backend], ids, **kwargs))
    event(kind if kind == "ran" else torch_logits.split(" ")[0])
    if kind == "refused":
        return
    assert torch_logits.shape == jax_logits.shape == (*np.shape(ids), V)
    assert np.isfinite(torch_logits).all() and np.isfinite(jax_logits).all()
    assert np.abs(torch_logits - jax_logits).max() <= FP32_GREEDY_REL * np.abs(torch_logits).max()
