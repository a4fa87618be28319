"""Token-id validation: every bad input is refused with the value and its place named."""

from __future__ import annotations

import numpy as np
import pytest

from spec import DEFAULT_SPEC, InputError, check_token_ids

V = DEFAULT_SPEC.vocab_size


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        (np.array([[1, 2, V]]), f"input_ids[0, 2] = {V} is outside the vocabulary [0, {V})"),
        (np.array([[1, -3, 2]]), "input_ids[0, 1] = -3 is outside"),
        (np.array([[1.0, 2.0]]), "integer token ids, got dtype float64"),
        (np.array([[True]]), "dtype bool"),
        (np.array([1, 2, 3]), "rank 1"),
        (np.zeros((1, 0), np.int64), "empty"),
        (np.zeros((1, DEFAULT_SPEC.max_position_embeddings + 1), np.int64), "max_position_embeddings=512"),
    ],
)
def test_bad_ids(ids, needle):
    with pytest.raises(InputError) as err:
        check_token_ids(ids, DEFAULT_SPEC)
    assert needle in str(err.value)


def test_past_length_counts_toward_max_positions():
    check_token_ids(np.zeros((1, 12), np.int64), DEFAULT_SPEC, past_length=500)
    with pytest.raises(InputError, match="reaches position 513"):
        check_token_ids(np.zeros((1, 13), np.int64), DEFAULT_SPEC, past_length=500)
