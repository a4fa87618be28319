"""spec/host_memory.py: weight buffers on 2 MiB pages where the machine gives them, plain memory where not."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from spec import host_memory

needs_thp = pytest.mark.skipif(not host_memory.available(), reason="no transparent huge pages to ask for here")


def _mapping_flags(address: int) -> dict[str, str]:
    """/proc/self/smaps' fields of the mapping holding `address`."""
    fields, inside = {}, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's first line: start-end perms ...
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
    return fields


@needs_thp
def test_a_large_buffer_starts_on_a_huge_page_and_is_eligible_for_them():
    nbytes = 3 * host_memory.HUGE + 12345  # not a multiple of the page
    buf = host_memory.empty(nbytes)
    assert buf.shape == (nbytes,) and buf.dtype == np.uint8 and buf.flags.writeable
    assert buf.ctypes.data % host_memory.HUGE == 0
    buf[:] = 7  # every byte, to the last, is ours to write
    assert int(buf[0]) == int(buf[-1]) == 7
    assert _mapping_flags(buf.ctypes.data).get("THPeligible") == "1"


def test_a_small_buffer_is_plain_memory():
    buf = host_memory.empty(host_memory.HUGE - 1)
    assert buf.shape == (host_memory.HUGE - 1,)
    buf[-1] = 3
    assert buf[-1] == 3


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_an_array_of_any_weight_dtype(dtype):
    shape = (1024, 1537)  # over 2 MiB in every dtype; an odd width
    array = host_memory.empty_array(shape, dtype)
    assert array.shape == shape and array.dtype == np.dtype(dtype) and array.flags.c_contiguous
    values = np.arange(array.size, dtype=np.float32).reshape(shape) % 251
    np.copyto(array, values, casting="unsafe")
    np.testing.assert_array_equal(array.astype(np.float32), values.astype(dtype).astype(np.float32))


@pytest.mark.parametrize("bad", [-1, 2.5, None])
def test_a_bad_size_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="nbytes must be an int >= 0"):
        host_memory.empty(bad)


def test_the_setting_is_read_as_linux_writes_it(tmp_path, monkeypatch):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    monkeypatch.setattr(host_memory, "_SETTING", setting)
    assert host_memory.thp_mode() == "madvise"
    setting.write_text("always madvise [never]\n")
    assert host_memory.thp_mode() == "never" and not host_memory.available()
    monkeypatch.setattr(host_memory, "_SETTING", tmp_path / "absent")
    assert host_memory.thp_mode() is None and not host_memory.available()
    assert host_memory.empty(3 * host_memory.HUGE).shape == (3 * host_memory.HUGE,)  # plain memory then
