"""docs/tutorial.md is executed and cross-checked here and in the files named below, so that it cannot drift
from the code.

This file runs it and checks its output and its sections; the other checks have files of their own:

- Every ```python block runs, in file order, in a fresh subprocess whose working directory is the repository
  root (as a reader's fresh session would: the tutorial's first block sets TRITON_INTERPRET and the JAX
  device count before triton and JAX start). Section 0's blocks share one namespace; every later section
  runs in its own copy of the namespace section 0 left, so a section that reads a name only an earlier
  section defines fails with a NameError here, as it would for a reader who runs section 0 and jumps to it.
  No section rebinds a name section 0 defines (checked statically), so running the whole file in one
  namespace, as a reader going through it in order does, is the same program. The subprocess gets an empty
  cache directory, so the built-in checkpoint is written from scratch, as on a fresh clone. ```console /
  ```text / ```mermaid blocks are never executed. (Parsing, the static checks and the in-process runner:
  tutorial_blocks.py.)
- Output: a ```text block preceded by the line `<!-- output -->` shows the stdout of the python block just
  before it and must say the same thing on any machine (output_match.py's `output_mismatch`, rules beside it
  and tested in test_output_match.py: words exactly, whitespace and column widths ignored, integers exactly,
  decimals to the digits shown, and a parity report's measured errors within the bound the report prints
  beside them; a line `...` skips any number of lines, `...` inside a line matches any text). A python block
  that prints must be followed by such a block, so every printed line of the tutorial is real output. Numbers
  the prose states are asserted inside the blocks that compute them.
- References, mapping tables, checkpoint tensor names and parity component names: every one the tutorial
  gives exists (test_tutorial_references.py, with tutorial_references.py).
- Pictures, mermaid diagrams and line length: test_tutorial_rendering.py, with tutorial_rendering.py.
- Sections stand alone: every name a section's code reads is defined in section 0 or in that section
  (statically, and at run time by the per-section namespaces above). Process state (imported modules, JAX's
  caches, torch's global seed) is shared by the sections of one run; `TUTORIAL_FRESH_PROCESSES=1` adds one
  test per section that runs section 0 and that section alone in a fresh process (15-25 s each: not in CI).

Run `python tests/docs/test_tutorial.py` to execute the tutorial and print each block's output and any
mismatch; `--sections=10,12` runs section 0 and then only those sections; `--update` rewrites the output
blocks that no longer match (review the diff before committing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

if __name__ == "__main__":  # a script's path is its folder (tests/docs): `tests` and the project from the root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.docs.output_match import output_mismatch
from tests.docs.tutorial_blocks import (
    OUTPUT_MARK,
    REPO,
    TUTORIAL,
    parse_blocks,
    rebound_setup_names,
    run_blocks,
    section_of,
    section_ranges,
    undefined_names,
)

RUN_TIMEOUT_S = 600  # a hang guard for the tutorial's subprocess, not a speed check


# ---- the tests -------------------------------------------------------------------------------------------------
def _run_tutorial(path: Path, cache_dir: str, sections: set[int] | None = None) -> list[dict]:
    path_entries = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        **os.environ,
        "XDG_CACHE_HOME": cache_dir,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(path_entries),
    }
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        env["TMPDIR"] = tmp  # the tutorial's scratch checkpoints (tempfile.mkdtemp) go with this directory
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--json", str(out), str(path)]
            + ([f"--sections={','.join(map(str, sorted(sections)))}"] if sections is not None else []),
            cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
        if not out.is_file():
            raise AssertionError(f"the tutorial runner crashed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def test_tutorial_runs_and_shows_its_real_output(tmp_path):
    results = _run_tutorial(TUTORIAL, str(tmp_path / "cache"))
    blocks = {b.line: b for b in parse_blocks(TUTORIAL.read_text()) if b.lang == "python"}
    failed = [r for r in results if r["error"]]
    assert not failed, "\n".join(
        f"docs/tutorial.md block at line {r['line']} (section {r['section']}) failed:\n{r['error']}" for r in failed
    )
    assert len(results) == len(blocks)
    problems = []
    for result in results:
        block = blocks[result["line"]]
        if block.output is None:
            if result["stdout"].strip():
                problems.append(f"block at line {block.line} prints but no `{OUTPUT_MARK}` block shows it")
            continue
        mismatch = output_mismatch(block.output.code, result["stdout"])
        if mismatch:
            problems.append(f"output block at line {block.output.line} does not match block {block.line}: {mismatch}")
    assert not problems, "\n".join(problems)


def test_every_section_defines_what_it_uses():
    # A reader may run section 0 and jump to any section: every name a section's code reads must be defined in
    # section 0 or in that section (statically: names, not values; run one with --sections=N to see it work).
    assert not undefined_names(TUTORIAL.read_text())
    assert undefined_names("## 0. Set-up\n```python\nx = 1\n```\n## 1. A\n```python\nprint(x, y)\n```\n") == {1: {"y"}}


def test_no_section_rebinds_a_setup_name():
    # With this, the whole file run in one namespace (a reader going through it in order) is the same program
    # as each section run in its own copy of section 0's namespace (what the test above runs).
    assert not rebound_setup_names(TUTORIAL.read_text())
    text = "## 0. S\n```python\nimport os\nd = 1\n```\n## 1. A\n```python\nimport os\nd = [k for k in (1,)]\n```\n"
    assert rebound_setup_names(text) == {1: {"d"}}
    assert rebound_setup_names(text.replace("d = [k", "e = [d")) == {}  # a comprehension's names are its own


def test_sections_run_in_their_own_namespaces(tmp_path):
    text = "## 0. S\n```python\na = 1\n```\n## 1. A\n```python\nb = a\n```\n## 2. B\n```python\nprint(b)\n```\n"
    path = REPO / "docs" / f".tutorial-test-{os.getpid()}.md"  # run_blocks names blocks relative to the repo
    try:
        path.write_text(text)
        results = run_blocks(path)
    finally:
        path.unlink()
    assert [r["section"] for r in results] == [0, 1, 2]
    assert results[1]["error"] is None and "NameError" in results[2]["error"]


def _sections() -> list[int]:
    return sorted(n for n in section_ranges(TUTORIAL.read_text()) if n)


@pytest.mark.skipif(not os.environ.get("TUTORIAL_FRESH_PROCESSES"), reason="set TUTORIAL_FRESH_PROCESSES=1")
@pytest.mark.parametrize("section", _sections())
def test_each_section_runs_after_section_0_in_a_fresh_process(section, tmp_path):
    results = _run_tutorial(TUTORIAL, str(tmp_path / "cache"), {section})
    failed = [r for r in results if r["error"]]
    assert not failed, f"section {section}, block at line {failed[0]['line']}:\n{failed[0]['error']}"
    assert {r["section"] for r in results} == {0, section}


def test_section_runner_selects_section_0_and_the_asked_sections():
    text = "## 0. S\n```python\na = 1\n```\n## 1. A\n```python\nb = 2\n```\n## 2. B\n```python\nc = a\n```\n"
    ranges = section_ranges(text)
    assert ranges == {0: (1, 4), 1: (5, 8), 2: (9, 12)}
    assert [section_of(b.line, ranges) for b in parse_blocks(text)] == [0, 1, 2]


# ---- command line --------------------------------------------------------------------------------------------
def _update(path: Path, results: list[dict]) -> int:
    """Rewrite the output blocks that do not match what their python block printed."""
    lines = path.read_text().splitlines()
    stdout = {r["line"]: r["stdout"] for r in results}
    changed = 0
    for block in reversed(parse_blocks(path.read_text())):  # bottom-up: earlier line numbers stay valid
        if block.lang == "python" and block.output is not None and block.line in stdout:
            if output_mismatch(block.output.code, stdout[block.line]):
                start = block.output.line  # the fence line (1-based) == index of the first body line
                end = start + len(block.output.code.rstrip("\n").splitlines())
                lines[start:end] = stdout[block.line].rstrip("\n").splitlines()
                changed += 1
    path.write_text("\n".join(lines) + "\n")
    return changed


def main(argv: list[str]) -> int:
    os.chdir(REPO)  # the tutorial's paths are the repository root's (the import path is set at the top)
    args = [a for a in argv if not a.startswith("--")]
    json_out = argv[argv.index("--json") + 1] if "--json" in argv else None
    if json_out:
        args.remove(json_out)
    path = Path(args[0]).resolve() if args else TUTORIAL
    only = next((a.partition("=")[2] for a in argv if a.startswith("--sections=")), None)
    results = run_blocks(path, None if only is None else {int(n) for n in only.split(",")})
    if json_out:
        Path(json_out).write_text(json.dumps(results))
        return 0
    blocks = {b.line: b for b in parse_blocks(path.read_text()) if b.lang == "python"}
    for r in results:  # (--sections=10,12: section 0, then only those sections, as a reader jumping there)
        print(f"---- line {r['line']} ({r['seconds']:.1f}s)")
        print(r["stdout"], end="")
        if r["error"]:
            print(r["error"])
        shown = blocks[r["line"]].output
        mismatch = output_mismatch(shown.code, r["stdout"]) if shown else None
        if mismatch:
            print(f"!!!! output block at line {shown.line} differs: {mismatch}")
    if "--update" in argv:
        print(f"updated {_update(path, results)} output block(s)")
    return 1 if any(r["error"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
