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
        ([], "input_ids is empty (shape [0])"),  # numpy makes it float64: the emptiness is the fault to name
        ([[]], "input_ids is empty (shape [1, 0])"),
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


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64])
def test_every_integer_dtype_is_accepted_as_int64(dtype):
    ids = check_token_ids(np.array([[1, 2, 120]], dtype=dtype), DEFAULT_SPEC)
    assert ids.dtype == np.int64 and ids.tolist() == [[1, 2, 120]]


def test_uint64_ids_beyond_int64_are_refused_not_wrapped():
    with pytest.raises(InputError, match=r"input_ids\[0, 1\] = 18446744073709551615 is outside the vocabulary"):
        check_token_ids(np.array([[1, 2**64 - 1]], dtype=np.uint64), DEFAULT_SPEC)


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        ([[1, 2], [3]], "must be a rectangular array"),
        ([[1, 2], 3], "must be a rectangular array"),
        ([[1, "a"]], "integer token ids, got dtype <U21"),
        ([[1, 2**70]], "rectangular array of integers"),
        (np.array([[1, 2]], np.float16), "integer token ids, got dtype float16"),
    ],
)
def test_ragged_and_mixed_lists_are_refused(ids, needle):
    with pytest.raises(InputError) as err:
        check_token_ids(ids, DEFAULT_SPEC)
    assert needle in str(err.value)


def test_positions_are_checked_against_the_rope_range():
    from spec import check_positions

    good = check_positions(np.array([[0, 5, 511]], np.int32), DEFAULT_SPEC, 1, 3)
    assert good.dtype == np.int64 and good.tolist() == [[0, 5, 511]]
    for positions, needle in [
        ([[0, 1, 512]], "positions[0, 2] = 512 is outside [0, 512)"),
        ([[0, -1, 2]], "positions[0, 1] = -1 is outside"),
        ([[0, 1]], "positions has shape [1, 2], expected [1, 3]"),
        ([[0.0, 1.0, 2.0]], "positions must hold integer positions, got dtype float64"),
        ([[True, False, True]], "got dtype bool"),
    ]:
        with pytest.raises(InputError) as err:
            check_positions(positions, DEFAULT_SPEC, 1, 3)
        assert needle in str(err.value)


def test_attention_masks():
    from spec import check_attention_mask
    from spec.inputs import check_left_padded

    assert check_attention_mask(np.array([[0, 1, 1], [1, 1, 1]]), 2, 3).dtype == np.bool_
    assert check_attention_mask([[True, True]], 1, 2).all()
    for mask, needle in [
        ([[1, 1, 1], [0, 0, 0]], "attention_mask row 1 is all zeros"),
        ([[1, 2, 1]], "attention_mask[0, 1] = 2: a mask holds only 0 and 1"),
        ([[1.0, 1.0, 1.0]], "0/1 (integer or bool), got dtype float64"),
        ([[1, 1]], "attention_mask has shape [1, 2], expected [1, 3]"),
    ]:
        with pytest.raises(InputError) as err:
            check_attention_mask(mask, len(mask), 3)
        assert needle in str(err.value)
    check_left_padded(np.array([[0, 0, 1, 1], [1, 1, 1, 1]], bool))
    for mask, row in [([[1, 1, 1, 1], [1, 1, 0, 0]], 1), ([[1, 0, 1, 1]], 0)]:
        with pytest.raises(InputError, match=f"attention_mask row {row} is not left-padded"):
            check_left_padded(np.array(mask, bool))


def test_dtype_names_and_seeds():
    from spec import dtype_name
    from spec.inputs import check_seed

    assert dtype_name("bfloat16") == "bfloat16"
    assert dtype_name(np.float16) == "float16" and dtype_name(np.dtype("float32")) == "float32"  # a framework's dtype
    for bad in ("float64", "int8", "fp32", None, np.float64, np.int32, 1, object()):
        with pytest.raises(InputError, match="is not supported \\(choose: float32, bfloat16, float16\\)"):
            dtype_name(bad)
    assert check_seed(2**63 - 1) == 2**63 - 1 and check_seed(np.uint8(3)) == 3
    for bad in (-1, 2**63, 2**70, True, 1.0, "3"):
        with pytest.raises(InputError, match=r"seed must be an integer in \[0, 2\*\*63\)"):
            check_seed(bad)


def test_generation_requests():
    from spec.generation import SamplingParams, prepare_prompts

    ragged = prepare_prompts([[5, 6, 7], [8]], DEFAULT_SPEC, 4)
    assert ragged.mask.tolist() == [[1, 1, 1], [0, 0, 1]] and ragged.lengths == (3, 1)
    padded = prepare_prompts([[0, 5], [6, 7]], DEFAULT_SPEC, 4, attention_mask=[[0, 1], [1, 1]])
    assert padded.lengths == (1, 2)
    for kwargs, needle in [
        (dict(attention_mask=[[1, 1], [1, 0]]), "attention_mask row 1 is not left-padded ([1, 0])"),
        (dict(attention_mask=[[1, 1], [0, 0]]), "attention_mask row 1 is all zeros"),
    ]:
        with pytest.raises(InputError) as err:
            prepare_prompts([[5, 6], [7, 8]], DEFAULT_SPEC, 4, **kwargs)
        assert needle in str(err.value)
    with pytest.raises(InputError, match=r"prompt 1\[0, 0\] = 999 is outside the vocabulary"):
        prepare_prompts([[5, 6], [999]], DEFAULT_SPEC, 4)
    for kwargs, needle in [
        (dict(seed=2**70), "seed must be an integer"),
        (dict(seed=-1), "seed must be an integer"),
        (dict(temperature="hot"), "temperature must be >= 0 (0 = greedy) and finite"),
        (dict(temperature=float("nan")), "temperature must be >= 0 (0 = greedy) and finite"),
        (dict(top_k=True), "top_k must be a positive integer"),
        (dict(top_p="0.9"), "top_p must lie in (0, 1]"),
    ]:
        with pytest.raises(InputError) as err:
            SamplingParams(**kwargs)
        assert needle in str(err.value)
