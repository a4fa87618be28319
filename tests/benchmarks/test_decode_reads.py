"""benchmarks/decode_reads.py: the products it times are exactly a step's weights, the states split its rounds into
thirds, a real run at small sizes prints and writes every arm in every run, and bad arguments are refused."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from benchmarks import decode_reads
from benchmarks.qwen3_shape import SHAPES, active_parameters
from kernels.cpu import gemv_fetch

needs_kernel = pytest.mark.skipif(gemv_fetch.drivers() is None, reason="the CPU product kernel does not run here")


def test_the_products_are_the_weights_a_token_reads_less_the_norms():
    spec = SHAPES["qwen3-0.6b"]
    products = decode_reads.step_products(spec)
    assert len(products) == 6 * spec.num_hidden_layers + 1 and products[-1] == ("head", 151936, 1024)
    assert products[4] == ("0.gate_up", 2 * 3072, 1024) and products[5] == ("0.down", 1024, 3072)
    norms = spec.num_hidden_layers * (2 * spec.hidden_size + 2 * spec.head_dim) + spec.hidden_size  # + q/k norms
    assert sum(out * n_in for _, out, n_in in products) + norms == active_parameters(spec)


def test_a_mixture_of_experts_is_refused_by_name():
    with pytest.raises(ValueError, match="32 experts"):
        decode_reads.step_products(SHAPES["qwen3-moe"])


def test_the_states_are_thirds_of_the_readings():
    records = [{"arm": "rows", "reading": 10.0 * i, "rate": 5.0 * i} for i in range(1, 10)]
    records += [{"arm": "one", "reading": 10.0 * i, "rate": 10.0 * i} for i in range(1, 10)]
    thirds = decode_reads.by_state(records)
    assert [t["state"] for t in thirds] == ["low", "middle", "high"]
    assert [t["reading_gb_s"] for t in thirds] == [[1e-8, 3e-8], [4e-8, 6e-8], [7e-8, 9e-8]]
    for third in thirds:
        assert set(third["arms"]) == {"rows", "one"}
        assert third["arms"]["rows"]["ratio"] == 0.5 and third["arms"]["one"]["ratio"] == 1.0
        assert third["arms"]["rows"]["runs"] == 3
    assert thirds[1]["arms"]["rows"]["gb_s"] == pytest.approx(25e-9)  # the median of 20, 25, 30 bytes/s


@needs_kernel
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_run_times_every_arm_in_every_round(dtype, tmp_path, capsys):
    out = tmp_path / "reads.json"
    argv = ["--rounds", "3", "--layers", "1", "--reading-mb", "4", "--dtype", dtype, "--json", str(out)]
    assert decode_reads.main(argv) == 0
    text = capsys.readouterr().out
    assert "machine:" in text and "(1 layers)" in text
    figures = json.loads(out.read_text())
    assert figures["layers"] == 1 and figures["dtype"] == dtype and figures["arms"] == list(decode_reads.ARMS)
    size = decode_reads.SIZES[dtype]
    one_layer = dataclasses.replace(SHAPES["qwen3-0.6b"], num_hidden_layers=1)
    norms = 2 * one_layer.hidden_size + 2 * one_layer.head_dim + one_layer.hidden_size
    assert figures["step_bytes"] == size * (active_parameters(one_layer) - norms)
    for arm in decode_reads.ARMS:
        assert sum(t["arms"].get(arm, {"runs": 0})["runs"] for t in figures["states"]) == 3
        ratios = [t["arms"][arm]["ratio"] for t in figures["states"] if arm in t["arms"]]
        assert all(r > 0 for r in ratios)
    printed = [row for row in text.splitlines() if "readings" in row]
    assert len(printed) == len(figures["states"]) and all(re.search(r"x[0-9.]+ of its reading", r) for r in printed)


@needs_kernel
def test_both_fetches_run_as_arms_of_their_own(tmp_path):
    out = tmp_path / "reads.json"
    argv = ["--rounds", "3", "--layers", "1", "--reading-mb", "4", "--fetch", "both", "--json", str(out)]
    assert decode_reads.main(argv) == 0
    figures = json.loads(out.read_text())
    assert figures["arms"] == list(decode_reads.FETCHED_ARMS)
    for arm in decode_reads.FETCHED_ARMS:
        assert sum(t["arms"].get(arm, {"runs": 0})["runs"] for t in figures["states"]) == 3, arm


@pytest.mark.parametrize(
    "argv",
    [["--rounds", "2"], ["--layers", "0"], ["--shape", "qwen3-moe"], ["--dtype", "float16"], ["--fetch", "ahead"]],
)
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        decode_reads.main(argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err
