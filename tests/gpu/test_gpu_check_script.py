"""benchmarks/gpu_check.sh and its report, on the CPU (these tests are not marked `gpu`: they run everywhere).

Without a GPU the script must refuse before running anything: a message that says why and what to run
instead, exit status 2, no JSON. Its report (benchmarks/gpu_report.py::check_report) and the floors
(benchmarks/kernel_figures.py::evaluate_floors) are plain Python over the figures, checked here on made-up ones.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.gpu_report import check_report, report_main
from benchmarks.kernel_figures import bytes_moved, evaluate_floors, record_of, save, sweep

ROOT = Path(__file__).resolve().parents[2]
COPY_GBPS = 4000.0


def _no_gpu() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script would run for real")


def test_gpu_check_refuses_cleanly_without_a_gpu(tmp_path: Path) -> None:
    _no_gpu()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"OUT": str(tmp_path / "out")}
    for args in ([str(tmp_path / "given.json")], []):  # a given path, and $OUT
        done = subprocess.run(
            ["bash", "benchmarks/gpu_check.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert "no GPU found" in done.stderr and "refusing to run" in done.stderr
        assert "python -m pytest" in done.stderr  # what to run instead
        assert "gpu tests" not in done.stdout  # refused before running anything
    assert not (tmp_path / "given.json").exists() and not (tmp_path / "out").exists()


def test_kernel_benchmark_requiring_a_gpu_exits_2_without_one() -> None:
    _no_gpu()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "benchmarks/kernels.py", "--require-gpu"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "needs a GPU" in done.stdout


def _result(framework: str, kernel: str, tokens: int, width: int, fused_of_copy: float, vs_plain: float) -> dict:
    """A benchmark record: the fused kernel at `fused_of_copy` of the copy bandwidth, `vs_plain` x the plain ops."""
    nbytes = 1_000_000_000
    fused = nbytes / (fused_of_copy * COPY_GBPS * 1e9)  # seconds per call
    seconds = {"fused": fused, "plain": fused * vs_plain, "compiled": fused * 1.05}
    case = {"framework": framework, "kernel": kernel, "dtype": "bfloat16", "tokens": tokens, "width": width}
    return case | record_of(seconds, nbytes, COPY_GBPS, None)


def test_floors_apply_to_their_shape_only() -> None:
    results = [
        _result("torch", "add_rms_norm", 4096, 4096, 0.90, 2.5),  # both floors hold
        _result("torch", "silu_and_mul", 4096, 4096, 0.80, 2.5),  # below 85% of copy
        _result("jax", "add_rms_norm", 16384, 4096, 0.92, 1.2),  # below 1.3x the plain ops
        _result("jax", "silu_and_mul", 1024, 4096, 0.10, 1.0),  # too few tokens: no floor applies
        _result("jax", "silu_and_mul", 4096, 1024, 0.10, 1.0),  # another width: no floor applies
    ]
    assert abs(results[0]["variants"]["fused"]["of_copy"] - 0.90) < 1e-12
    assert abs(results[0]["fused_vs_plain"] - 2.5) < 1e-12
    floors = evaluate_floors(results)
    assert len(floors) == 6  # two floors for each of the three floor-shaped cases
    failed = {(f["framework"], f["kernel"], f["bound"]) for f in floors if not f["passed"]}
    assert failed == {("torch", "silu_and_mul", 0.85), ("jax", "add_rms_norm", 1.3)}


def _junit(path: Path, outcomes: dict[str, str]) -> Path:
    """A pytest --junitxml file with one test case per name, each 'passed', 'failed' or 'skipped'."""
    cases = []
    for name, outcome in outcomes.items():
        inner = {"passed": "", "failed": '<failure message="assert 1 == 2"/>', "skipped": '<skipped message="no GPU"/>'}
        cases.append(
            f'<testcase classname="tests.gpu.test_gpu_model" name="{name}" time="1.5">{inner[outcome]}</testcase>'
        )
    path.write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>'
    )
    return path


def _kernels_json(path: Path, results: list[dict], skipped: dict | None = None) -> Path:
    floors = evaluate_floors(results)
    path.write_text(json.dumps({"results": results, "floors": floors, "skipped": skipped or {}}))
    return path


def test_check_report_passes_only_when_every_check_ran_and_holds(tmp_path: Path) -> None:
    good = [_result(fw, k, 4096, 4096, 0.9, 2.0) for fw in ("torch", "jax") for k in ("add_rms_norm", "silu_and_mul")]
    tests = _junit(tmp_path / "ok.xml", {"test_a": "passed", "test_b": "passed"})
    kernels = _kernels_json(tmp_path / "ok.json", good)

    def report(tests_xml=tests, tests_status=0, kernels_json=kernels, kernels_status=0) -> dict:
        return check_report(tests_xml, tests_status, kernels_json, kernels_status, {"torch": "H200"}, 300.0, 480.0)

    passed = report()
    assert passed["passed"] and passed["problems"] == []
    assert passed["tests"]["passed"] == 2 and passed["tests"]["total"] == 2
    assert len(passed["figures"]) == 4 and len(passed["floors"]) == 8
    assert {"fused_of_copy", "plain_of_copy", "compiled_of_copy", "fused_vs_plain"} <= set(passed["figures"][0])

    skipped = report(tests_xml=_junit(tmp_path / "skip.xml", {"test_a": "passed", "test_b": "skipped"}))
    assert not skipped["passed"] and any("skipped, so not checked" in p for p in skipped["problems"])
    failed = report(tests_xml=_junit(tmp_path / "fail.xml", {"test_a": "failed"}), tests_status=1)
    assert not failed["passed"] and failed["tests"]["failed"][0]["message"] == "assert 1 == 2"
    assert not report(tests_xml=tmp_path / "missing.xml", tests_status=124)["passed"]  # timed out, no report
    slow = _kernels_json(tmp_path / "slow.json", [*good[:3], _result("jax", "silu_and_mul", 4096, 4096, 0.5, 2.0)])
    below = report(kernels_json=slow)
    assert not below["passed"] and below["problems"] == [
        "below the floor: jax silu_and_mul [4096 x 4096] fused bandwidth / copy bandwidth 0.5 < 0.85"
    ]
    unmeasured = report(kernels_json=_kernels_json(tmp_path / "none.json", [], skipped={"jax": "no GPU visible"}))
    assert not unmeasured["passed"] and len(unmeasured["problems"]) == 2  # jax skipped; floors not evaluated
    killed = tmp_path / "killed.json"  # KILLed after --kill-after: the figures it saved, no floors of its own
    killed.write_text(json.dumps({"results": good, "skipped": {}}))
    late = report(kernels_json=killed, kernels_status=137)
    assert len(late["floors"]) == 8 and all(f["passed"] for f in late["floors"])  # evaluated by the report
    assert late["problems"] == [
        "benchmarks/kernels.py ran past its time budget",
        "benchmark skipped killed: stopped before its end; floors evaluated here",
    ]


def test_report_main_writes_the_json_and_exits_with_the_verdict(tmp_path: Path, capsys) -> None:
    good = [_result("torch", k, 4096, 4096, 0.9, 2.0) for k in ("add_rms_norm", "silu_and_mul")]
    args = [
        "--tests-xml", str(_junit(tmp_path / "t.xml", {"test_a": "passed"})), "--tests-status", "0",
        "--kernels-json", str(_kernels_json(tmp_path / "k.json", good)), "--kernels-status", "0",
        "--gpus", '{"torch": "NVIDIA H200"}', "--seconds", "250", "--budget-seconds", "480",
        "--out", str(tmp_path / "out" / "gpu_check.json"),
    ]  # fmt: skip
    assert report_main(args) == 0
    written = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert written["passed"] and written["gpus"] == {"torch": "NVIDIA H200"}
    printed = capsys.readouterr().out
    assert "gpu_check PASS" in printed and "fused bandwidth / copy bandwidth: 90.0%" in printed
    args[args.index("--tests-status") + 1] = "124"
    assert report_main(args) == 1
    assert "ran past their time budget" in capsys.readouterr().out


def test_an_interrupted_benchmark_writes_what_it_measured(tmp_path: Path, monkeypatch) -> None:
    """gpu_check.sh stops benchmarks/kernels.py with SIGINT at its time budget: the shapes measured by then are in
    the JSON with their floors evaluated, and the interruption is named. (The measuring itself needs a GPU: a
    stand-in for it records one floor-shaped shape and is interrupted before the next.)"""
    from benchmarks import kernels

    def one_shape_then_interrupted(args, out) -> None:
        out["results"].append(_result("torch", "add_rms_norm", 4096, 4096, 0.9, 2.0))
        save(args, out)
        assert json.loads(args.json.read_text())["results"], "saved after the shape, before the interruption"
        raise KeyboardInterrupt

    monkeypatch.setattr(kernels, "torch_gpu", lambda: True)
    monkeypatch.setattr(kernels, "jax_gpu", lambda: False)
    monkeypatch.setattr(kernels, "bench_torch", one_shape_then_interrupted)
    path = tmp_path / "kernels.json"
    assert kernels.main(["--framework", "torch", "--json", str(path)]) == 0
    written = json.loads(path.read_text())
    assert [r["tokens"] for r in written["results"]] == [4096]
    assert written["floors"] and written["floors_passed"] is True
    assert "interrupted" in written["skipped"]
    report = check_report(None, 0, path, 124, {"torch": "H200"}, 480.0, 480.0)
    assert not report["passed"] and report["figures"]  # the figures are kept, the time-out still fails the check
    assert "benchmarks/kernels.py ran past its time budget" in report["problems"]


def test_a_framework_that_fails_leaves_the_others_figures(tmp_path: Path, monkeypatch, capsys) -> None:
    """A failure in one framework's sweep (a compile error, a CUDA error) is named in the JSON and the exit status,
    and the other framework is still measured (stand-ins for both sweeps: the measuring itself needs a GPU)."""
    from benchmarks import kernels

    def torch_fails(args, out) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def jax_measures(args, out) -> None:
        out["results"].append(_result("jax", "add_rms_norm", 4096, 4096, 0.9, 2.0))

    monkeypatch.setattr(kernels, "torch_gpu", lambda: True)
    monkeypatch.setattr(kernels, "jax_gpu", lambda: True)
    monkeypatch.setattr(kernels, "bench_torch", torch_fails)
    monkeypatch.setattr(kernels, "bench_jax", jax_measures)
    path = tmp_path / "kernels.json"
    assert kernels.main(["--json", str(path)]) == 1
    written = json.loads(path.read_text())
    assert [r["framework"] for r in written["results"]] == ["jax"]
    assert written["skipped"] == {"torch": "failed: RuntimeError: CUDA error: an illegal memory access was encountered"}
    assert "torch: FAILED (RuntimeError" in capsys.readouterr().out
    report = check_report(None, 0, path, 1, {"torch": "H200", "jax": "H200"}, 300.0, 480.0)
    assert not report["passed"] and any("benchmark skipped torch: failed" in p for p in report["problems"])


def test_sweep_times_every_shape_and_saves_after_each(tmp_path: Path, capsys) -> None:
    """benchmarks/kernel_figures.py::sweep, the loop both frameworks' GPU sweeps run, over CPU stand-ins for the
    cases and the timer: one record per (kernel, width, tokens) in that order, with the bytes the op moves and the
    speed-ups of the timed seconds, the JSON written after each shape and before `after_shape`."""
    args = argparse.Namespace(
        kernels=["add_rms_norm", "silu_and_mul"], widths=[4096, 1000], tokens=[1, 4096], dtype="bfloat16",
        warmup=1, samples=3, calls=2, json=tmp_path / "kernels.json",
    )  # fmt: skip
    seconds = {"fused": 1e-3, "plain": 3e-3, "compiled": 1.5e-3}
    made, saved = [], []

    def cases_of(kernel: str, tokens: int, width: int) -> dict:
        made.append((kernel, width, tokens))
        return {label: (lambda label=label: label) for label in seconds}

    def median(fn, warmup: int, samples: int, calls: int) -> float:
        assert (warmup, samples, calls) == (1, 3, 2)
        return seconds[fn()]

    def after_shape() -> None:
        saved.append(len(json.loads(args.json.read_text())["results"]))

    out = {"results": []}
    sweep("torch", args, out, 2, cases_of, median, 4000.0, None, after_shape)
    shapes = [(k, w, t) for k in args.kernels for w in args.widths for t in args.tokens]
    assert made == shapes
    assert [(r["kernel"], r["width"], r["tokens"]) for r in out["results"]] == shapes
    assert saved == list(range(1, len(shapes) + 1))
    norm = out["results"][1]  # add_rms_norm [4096 x 4096]
    assert (norm["framework"], norm["dtype"]) == ("torch", "bfloat16")
    assert norm["bytes"] == bytes_moved("add_rms_norm", 4096, 4096, 2) == (4 * 4096 * 4096 + 4096) * 2
    assert norm["fused_vs_plain"] == pytest.approx(3.0) and norm["fused_vs_compiled"] == pytest.approx(1.5)
    assert norm["variants"]["fused"]["gbps"] == pytest.approx(norm["bytes"] / 1e-3 / 1e9)
    assert norm["variants"]["fused"]["of_peak"] is None  # no spec peak given
    assert "torch add_rms_norm bfloat16 [4096 x 4096]" in capsys.readouterr().out


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "pallas"])
def test_the_jax_benchmark_donates_the_residual_to_the_new_residual(fused: bool) -> None:
    """benchmarks/kernels_jax.py's add_rms_norm step: the donated residual's buffer goes to output 0, which is the new
    residual (the array the kernel writes over the residual), and the sweep unpacks (new residual, out) in that order.
    With `out` first, as before, jit gave the buffer to `out` and XLA copied a [T, H] array every call. (CPU: the
    Pallas kernel in interpret mode; the alias is jit's, whatever runs inside.)"""
    import jax.numpy as jnp

    from benchmarks.kernels_jax import donating_step
    from kernels.pallas import add_rms_norm, add_rms_norm_reference
    from tests.kernels.tolerances import assert_within_tolerance

    step = donating_step(functools.partial(add_rms_norm if fused else add_rms_norm_reference, eps=1e-6))
    rng = np.random.default_rng(0)
    x, r = (jnp.asarray(rng.standard_normal((5, 96)), jnp.bfloat16) for _ in range(2))
    w = jnp.asarray(1 + 0.1 * rng.standard_normal(96), jnp.bfloat16)
    assert re.findall(r"tf\.aliasing_output = (\d+)", step.lower(x, r, w).as_text()) == ["0"]
    want_out, want_residual = add_rms_norm_reference(x, r, w, 1e-6)
    new_residual, out = step(x, jnp.copy(r), w)
    np.testing.assert_array_equal(np.asarray(new_residual, np.float32), np.asarray(want_residual, np.float32))
    assert_within_tolerance(np.asarray(out, np.float32), np.asarray(want_out, np.float32), "add_rms_norm", "bfloat16")
