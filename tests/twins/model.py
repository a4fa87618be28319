"""Behaviour both backends must share: known answers, the tied head, last-position logits, bad input.

Each test runs once per backend with the same body: the twins are held to one standard.
"""

from __future__ import annotations

import numpy as np
import pytest

from spec import InputError
from tests.backends import BACKENDS, load, rel_err, run, to_numpy


@pytest.fixture(scope="module", params=BACKENDS)
def model(request, default_dir):
    return load(request.param, default_dir)


def rms_norm(backend: str, x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None = None):
    if backend == "torch":
        import torch

        from torch_impl.layernorm import RMSNorm

        norm = RMSNorm(x.shape[-1], eps)
        with torch.no_grad():
            norm.weight.copy_(torch.as_tensor(weight))
            out = norm(torch.as_tensor(x)) if residual is None else norm(torch.as_tensor(x), torch.as_tensor(residual))
    else:
        import jax.numpy as jnp

        from jax_impl.layernorm import RMSNorm

        norm = RMSNorm(x.shape[-1], eps, dtype=jnp.float32)
        norm.weight[...] = jnp.asarray(weight)
        out = norm(jnp.asarray(x)) if residual is None else norm(jnp.asarray(x), jnp.asarray(residual))
    return tuple(to_numpy(o) for o in out) if residual is not None else to_numpy(out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_known_answer(backend):
    out = rms_norm(backend, np.array([[3.0, 4.0]], np.float32), np.ones(2, np.float32), eps=1e-30)
    np.testing.assert_allclose(out, [[0.8485281, 1.1313709]], rtol=1e-6)  # [3, 4] / sqrt(12.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_with_residual_returns_sum_as_new_residual(backend):
    x, r = np.array([[1.0, 1.0]], np.float32), np.array([[2.0, 3.0]], np.float32)
    out, new_residual = rms_norm(backend, x, np.array([1.0, 2.0], np.float32), 1e-30, residual=r)
    np.testing.assert_array_equal(new_residual, [[3.0, 4.0]])
    np.testing.assert_allclose(out, [[0.8485281, 2 * 1.1313709]], rtol=1e-6)


def test_repeated_ids_give_identical_embedding_rows(model):
    trace: dict = {}
    run(model, [[5, 17, 5, 5]], trace=trace)
    embed = to_numpy(trace["embed"])[0]
    assert np.array_equal(embed[0], embed[2]) and np.array_equal(embed[0], embed[3])
    assert not np.array_equal(embed[0], embed[1])


def test_tied_logits_equal_final_norm_times_embedding_transposed(model):
    trace: dict = {}
    logits = run(model, [[1, 2, 3, 250]], trace=trace)
    if hasattr(model, "parameters"):
        table = to_numpy(model.model.embed_tokens.weight)
    else:
        table = np.asarray(model.model.embed_tokens.weight[...])
    expected = to_numpy(trace["final_norm"]) @ table.T  # F.linear(x, E) == x @ E.T
    assert rel_err(logits, expected) <= 1e-6


def test_last_only_equals_last_row_of_full_logits(model):
    ids = np.array([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]])
    full = run(model, ids)
    last = run(model, ids, last_only=True)
    assert last.shape == (2, 1, full.shape[-1])
    assert rel_err(last[:, 0], full[:, -1]) <= 1e-6


def test_left_padding_matches_unpadded_row(model):
    ids = np.array([[7, 8, 9, 10, 11]])
    alone = run(model, ids)
    padded = np.array([[0, 0, 7, 8, 9, 10, 11]])
    mask = np.array([[0, 0, 1, 1, 1, 1, 1]])
    together = run(model, padded, attention_mask=mask)
    assert np.isfinite(together).all()
    assert rel_err(together[:, 2:], alone) <= 1e-5


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        ([[1, 2, 263]], "input_ids[0, 2] = 263 is outside the vocabulary [0, 263)"),
        ([[1, -1]], "input_ids[0, 1] = -1 is outside"),
        ([[1.5, 2.0]], "integer token ids"),
        ([1, 2, 3], "rank 1"),
        (np.zeros((2, 0), np.int64), "empty"),
        (np.zeros((1, 513), np.int64), "max_position_embeddings=512"),
    ],
)
def test_bad_input_is_refused_with_the_value(model, ids, needle):
    with pytest.raises(InputError) as err:
        run(model, ids)
    assert needle in str(err.value)


def test_bad_attention_mask_shape(model):
    with pytest.raises(InputError, match=r"attention_mask has shape \[1, 3\], expected \[1, 4\]"):
        run(model, [[1, 2, 3, 4]], attention_mask=np.ones((1, 3)))
