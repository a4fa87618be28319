"""benchmarks/attend_read.py: a real run at small sizes prints one line per cache length with both read rates, and
bad arguments are refused."""

from __future__ import annotations

import re

import pytest
import torch

from benchmarks import attend_read

needs_kernels = pytest.mark.skipif(not attend_read.runs_here(), reason="the CPU kernels do not run here")


@needs_kernels
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_run_prints_each_cache_length_with_both_rates(dtype, capsys):
    assert attend_read.main(["--repeats", "2", "--keys", "3", "37", "--dtype", dtype]) == 0
    rows = [row for row in capsys.readouterr().out.splitlines() if "keys (" in row]
    assert [int(row.split()[0]) for row in rows] == [3, 37]
    for row in rows:
        # three significant figures: a loaded machine's rate over a tiny cache (0.015 GB/s, seen in CI) is not 0.0
        rates = [float(rate) for rate in re.findall(r"([0-9.]+(?:e[-+]?[0-9]+)?) GB/s", row)]
        assert len(rates) == 2 and all(rate > 0 for rate in rates), row
        assert re.search(r"attention x[0-9.]+ of it", row), row


@needs_kernels
def test_measure_reports_the_caches_size_and_both_rates():
    r = attend_read.measure(9, torch.float32, 1)
    assert r["cache_mb"] == pytest.approx(2 * attend_read.KV_HEADS * 9 * attend_read.HEAD_DIM * 4 / 1e6)
    assert r["rates"]["attend"] > 0 and r["rates"]["gemv"] > 0 and r["ratio"] > 0


@pytest.mark.parametrize("argv", [["--keys", "0"], ["--repeats", "0"], ["--dtype", "float16"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        attend_read.main(argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err
