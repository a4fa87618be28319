"""The strict safetensors reader, case by case: every corruption the issue-17 sweep found is a CheckpointError
naming the file and the problem, and the valid spellings of the format still load (zero-copy)."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from spec import CheckpointError
from spec.safetensors_io import SafetensorsFile, write_safetensors

A = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.arange(4, dtype=np.float16)


def raw_file(tmp_path, header_text: str | bytes, data: bytes, name: str = "model.safetensors"):
    blob = header_text.encode() if isinstance(header_text, str) else header_text
    path = tmp_path / name
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


def two_tensors(**changes) -> dict:
    header = {
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
    }
    for name, fields in changes.items():
        header[name] = {**header[name], **fields}
    return header


DATA = A.tobytes() + B.tobytes()


def refused(tmp_path, header, data: bytes = DATA) -> str:
    text = header if isinstance(header, (str, bytes)) else json.dumps(header)
    path = raw_file(tmp_path, text, data)
    with pytest.raises(CheckpointError) as err:
        SafetensorsFile(path)
    message = str(err.value)
    assert str(path) in message  # every refusal names the file
    return message


def test_valid_file_loads_zero_copy(tmp_path):
    path = raw_file(tmp_path, json.dumps(two_tensors()), DATA)
    file = SafetensorsFile(path)
    a = file.get("a")
    assert np.array_equal(a, A) and np.array_equal(file.get("b"), B)
    assert isinstance(a.base, np.ndarray) and not a.flags.writeable and not a.flags.owndata  # a view of the map


def test_valid_spellings_still_load(tmp_path):
    """Header order != data order, zero-size tensors, scalars, padding spaces, null metadata, bfloat16."""
    c = np.array(1.5, dtype=ml_dtypes.bfloat16)
    header = {
        "__metadata__": None,
        "b": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
        "empty": {"dtype": "F32", "shape": [0, 5], "data_offsets": [24, 24]},
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "scalar": {"dtype": "BF16", "shape": [], "data_offsets": [32, 34]},
    }
    path = raw_file(tmp_path, json.dumps(header) + "   ", DATA + c.tobytes())
    file = SafetensorsFile(path)
    assert file.get("empty").shape == (0, 5) and file.get("scalar") == c and np.array_equal(file.get("a"), A)
    assert file.metadata == {}


def test_writer_output_round_trips(tmp_path):
    write_safetensors(tmp_path / "w.safetensors", {"a": A, "b": B}, {"note": "x"})
    file = SafetensorsFile(tmp_path / "w.safetensors")
    assert file.metadata == {"format": "pt", "note": "x"} and np.array_equal(file.get("b"), B)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"a": {"shape": [2.0, 3.0]}}, "shape must be a list of JSON integers >= 0"),
        ({"a": {"shape": [263.9, 64.2]}}, "shape must be a list of JSON integers >= 0"),
        ({"a": {"shape": ["2", "3"]}}, "shape must be a list of JSON integers >= 0"),
        ({"a": {"shape": [True, 6]}}, "shape must be a list of JSON integers >= 0"),
        ({"a": {"shape": [-2, -3]}}, "shape must be a list of JSON integers >= 0"),
        ({"a": {"shape": [2**64, 0]}}, "overflows int64"),  # zero elements, yet no array has that shape
        ({"a": {"shape": [2**62, 4, 0]}}, "overflows int64"),
        ({"a": {"shape": "2,3"}}, "shape must be a list"),
        ({"a": {"data_offsets": ["0", "24"]}}, "data_offsets must be a list of two JSON integers"),
        ({"a": {"data_offsets": [0.0, 24.0]}}, "data_offsets must be a list of two JSON integers"),
        ({"a": {"data_offsets": [0, 24, 24]}}, "data_offsets must be a list of two JSON integers"),
        ({"a": {"data_offsets": [24, 0]}}, "are not 0 <= begin <= end"),
        ({"a": {"dtype": ["F32"]}}, "dtype must be a string"),
        ({"a": {"dtype": 32}}, "dtype must be a string"),
        ({"a": {"dtype": "F64"}}, "has dtype F64; only F32, BF16 and F16 load"),
        ({"a": {"shape": [3, 3]}}, "declares 24 bytes, needs 36"),
        ({"b": {"data_offsets": [20, 28]}}, "overlaps 'a'"),
        ({"b": {"data_offsets": [28, 36]}}, "truncated"),
    ],
)
def test_corrupt_fields_are_refused_by_name(tmp_path, changes, needle):
    message = refused(tmp_path, two_tensors(**changes))
    assert needle in message, message


def test_overlap_gap_shift_and_trailing_bytes(tmp_path):
    both_at_zero = two_tensors(b={"data_offsets": [0, 8]})
    assert "overlaps" in refused(tmp_path, both_at_zero, DATA[:24])
    gap = two_tensors(a={"shape": [1, 3], "data_offsets": [0, 12]})
    assert "12 unclaimed bytes before tensor 'b'" in refused(tmp_path, gap)
    assert "4 trailing bytes" in refused(tmp_path, two_tensors(), b"\0\0\0\0" + DATA)  # data shifted by 4
    assert "5 trailing bytes" in refused(tmp_path, two_tensors(), DATA + b"extra")


def test_duplicate_names_and_keys(tmp_path):
    entry = '{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}'
    text = '{"a":' + entry + ',"a":' + entry + "}"
    assert "the key 'a' appears twice" in refused(tmp_path, text, DATA[:24])
    doubled = '{"a":{"dtype":"F32","dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}'
    assert "the key 'dtype' appears twice" in refused(tmp_path, doubled, DATA[:24])


@pytest.mark.parametrize("metadata", [[], ["format", "pt"], {"a": {"b": "c"}}, {"a": 1}, {"a": None}, "pt"])
def test_metadata_must_map_strings_to_strings(tmp_path, metadata):
    header = {"__metadata__": metadata, **two_tensors()}
    assert "__metadata__ must map strings to strings" in refused(tmp_path, header)


@pytest.mark.parametrize(
    ("spelling", "needle"),
    [
        ("1e400", "JSON integers"),  # parses to inf
        ("18446744073709551616", "overflows int64"),  # 2**64
        ("9" * 5000, "JSON integers"),  # past Python's int digit limit: never parsed as an int
        ("-0", "JSON integers"),
        ("NaN", "not valid JSON"),
        ("Infinity", "not valid JSON"),
    ],
)
def test_malformed_numbers_do_not_crash_the_parser(tmp_path, spelling, needle):
    text = json.dumps(two_tensors(a={"shape": ["@", 3]})).replace('"@"', spelling)
    assert needle in refused(tmp_path, text)


def test_deep_nesting_is_refused_before_the_parser_recurses(tmp_path):
    deep = '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"
    assert "nested more than 3 levels deep" in refused(tmp_path, deep, b"")
    unterminated = "[" * 100_000
    assert "nested" in refused(tmp_path, unterminated, b"")


@pytest.mark.parametrize(
    ("header", "needle"),
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[]", "not a JSON object"),
        (b'{"\\ud800":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}', "not valid Unicode"),
        (b'{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}\x00', "not valid JSON"),
        (b'{"a":{"dtype":"F32","shape":[2,3]}}', "lacks data_offsets"),
        (b'{"a":[1,2]}', "not an object"),
    ],
)
def test_malformed_headers(tmp_path, header, needle):
    assert needle in refused(tmp_path, header, DATA[:24] if b'"a"' in header else b"")


def test_length_prefix_and_truncation(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="truncated"):
        SafetensorsFile(path)
    path.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    with pytest.raises(CheckpointError, match="declares 9223372036854775808 header bytes"):
        SafetensorsFile(path)


def test_file_changed_on_disk_after_the_header_was_read(tmp_path):
    path = raw_file(tmp_path, json.dumps(two_tensors()), DATA)
    file = SafetensorsFile(path)
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match="changed on disk"):
        file.get("a")
