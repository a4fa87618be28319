"""The report of benchmarks/gpu_check.sh: after its two steps it calls report_main, which reads the gpu tests'
pytest --junitxml file and benchmarks/kernels.py's JSON, and writes one JSON (check_report) with the verdict.

Plain Python over files on disk, with no framework import: the same records and floors as
benchmarks/kernel_figures.py, read back from the JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.kernel_figures import VARIANTS, evaluate_floors, print_floors

TIMED_OUT = (124, 137)  # `timeout`'s exit status, and a KILL's after --kill-after


def junit_summary(path: Path) -> dict[str, Any]:
    """Counts, failures and skips of a pytest --junitxml file."""
    import xml.etree.ElementTree as ET

    cases = list(ET.parse(path).getroot().iter("testcase"))
    summary: dict[str, Any] = {"total": len(cases), "passed": 0, "failed": [], "skipped": [], "seconds": 0.0}
    for case in cases:
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        summary["seconds"] += float(case.get("time", 0) or 0)
        failure = next((e for e in case if e.tag in ("failure", "error")), None)
        skipped = case.find("skipped")
        if failure is not None:
            summary["failed"].append({"test": name, "message": (failure.get("message") or "")[:1000]})
        elif skipped is not None:
            summary["skipped"].append({"test": name, "reason": (skipped.get("message") or "")[:300]})
        else:
            summary["passed"] += 1
    return summary


def check_report(
    tests_xml: Path | None,
    tests_status: int,
    kernels_json: Path | None,
    kernels_status: int,
    gpus: dict[str, Any],
    seconds: float,
    budget_seconds: float,
) -> dict[str, Any]:
    """gpu_check.sh's one JSON: the GPU tests' outcome, every kernel figure, the floors, and what failed.

    It passes only when the tests ran and all passed (a skipped `gpu` test is a check that did not run), the
    benchmark ran, and every floor was evaluated and holds. Exit status 124 (137 after a KILL) is `timeout`'s:
    a step ran past its share of the time budget.
    """
    problems = []
    tests = junit_summary(tests_xml) if tests_xml is not None and tests_xml.is_file() else None
    if tests_status in TIMED_OUT:
        problems.append("the gpu tests ran past their time budget")
    if tests is None:
        problems.append(f"the gpu tests left no report (pytest exit status {tests_status})")
    else:
        if tests["total"] == 0:
            problems.append("no gpu test was collected")
        problems += [f"failed: {f['test']}" for f in tests["failed"]]
        problems += [f"skipped, so not checked: {s['test']} ({s['reason']})" for s in tests["skipped"]]
    kernels = json.loads(kernels_json.read_text()) if kernels_json is not None and kernels_json.is_file() else None
    if kernels is not None and "floors" not in kernels:  # KILLed before its end: its figures are saved shape by shape
        kernels["floors"] = evaluate_floors(kernels.get("results", []))
        kernels["skipped"] = {**kernels.get("skipped", {}), "killed": "stopped before its end; floors evaluated here"}
    if kernels_status in TIMED_OUT:
        problems.append("benchmarks/kernels.py ran past its time budget")
    if kernels is None:
        problems.append(f"benchmarks/kernels.py left no figures (exit status {kernels_status})")
    else:
        problems += [f"benchmark skipped {name}: {why}" for name, why in kernels.get("skipped", {}).items()]
        if not kernels.get("floors"):
            problems.append("the floors were not evaluated: no floor-shaped case was measured")
        problems += [
            f"below the floor: {f['framework']} {f['kernel']} [{f['tokens']} x {f['width']}] {f['floor']} "
            f"{f['value']:.3g} < {f['bound']}"
            for f in kernels.get("floors", [])
            if not f["passed"]
        ]
    figures = [
        {key: r[key] for key in ("framework", "kernel", "dtype", "tokens", "width")}
        | {f"{label}_of_copy": r["variants"][label]["of_copy"] for label in VARIANTS}
        | {"fused_vs_plain": r["fused_vs_plain"], "fused_vs_compiled": r["fused_vs_compiled"]}
        for r in (kernels or {}).get("results", [])
    ]
    return {
        "script": "benchmarks/gpu_check.sh",
        "passed": not problems,
        "problems": problems,
        "gpus": gpus,
        "seconds": seconds,
        "budget_seconds": budget_seconds,
        "tests": tests,
        "tests_exit_status": tests_status,
        "figures": figures,
        "floors": (kernels or {}).get("floors", []),
        "kernels": kernels,
        "kernels_exit_status": kernels_status,
    }


def report_main(argv: list[str]) -> int:
    """`python -c 'from benchmarks.gpu_report import report_main; ...' ARGS`: write gpu_check.sh's JSON, print it
    short."""
    parser = argparse.ArgumentParser(description="assemble benchmarks/gpu_check.sh's report")
    parser.add_argument("--tests-xml", type=Path, required=True)
    parser.add_argument("--tests-status", type=int, required=True)
    parser.add_argument("--kernels-json", type=Path, required=True)
    parser.add_argument("--kernels-status", type=int, required=True)
    parser.add_argument("--gpus", type=json.loads, default={})
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--budget-seconds", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    report = check_report(
        args.tests_xml, args.tests_status, args.kernels_json, args.kernels_status, args.gpus, args.seconds,
        args.budget_seconds,
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    tests = report["tests"]
    if tests is not None:
        print(
            f"gpu tests: {tests['passed']} passed, {len(tests['failed'])} failed, {len(tests['skipped'])} skipped "
            f"of {tests['total']}"
        )
    for f in report["figures"]:
        print(
            f"{f['framework']:<5} {f['kernel']:<12} [{f['tokens']} x {f['width']}] {f['dtype']}: of copy: fused "
            f"{f['fused_of_copy']:.1%}, plain ops {f['plain_of_copy']:.1%}, compiled {f['compiled_of_copy']:.1%}; "
            f"fused {f['fused_vs_plain']:.2f}x plain, {f['fused_vs_compiled']:.2f}x compiled"
        )
    print_floors(report["floors"])
    verdict = "PASS" if report["passed"] else "FAIL:\n  " + "\n  ".join(report["problems"])
    print(f"gpu_check {verdict}\n({report['seconds']:.0f} s of {report['budget_seconds']:.0f}; JSON: {args.out})")
    return 0 if report["passed"] else 1
