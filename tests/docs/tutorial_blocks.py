"""docs/tutorial.md read as a program: its fenced blocks, its numbered sections, and running them.

- Blocks (`parse_blocks`): the fenced blocks in file order. A ```text block preceded by the line
  `<!-- output -->` is an output block: it shows the stdout of the python block just before it (test_tutorial.py
  compares the two with output_match.py's rules). ```console / ```text / ```mermaid blocks are never executed.
- Sections (`section_ranges`): the `## N. Title` headings. Section 0 sets up what every later section uses.
- Sections stand alone, statically: `undefined_names` finds the names a section's code reads that neither section
  0 nor the section defines; `rebound_setup_names` the names section 0 binds that a later section binds again.
- Running (`run_blocks`, in the subprocess test_tutorial.py starts: `python tests/docs/test_tutorial.py --json
  OUT`): section 0's blocks share one namespace; every later section runs in its own copy of the namespace
  section 0 left, so a section that reads a name only an earlier section defines fails with a NameError, as it
  would for a reader who runs section 0 and jumps to it.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "tutorial.md"
OUTPUT_MARK = "<!-- output -->"
FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")


# ---- parsing -----------------------------------------------------------------------------------------------
@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    code: str
    output: Block | None = None  # for python blocks: the <!-- output --> text block that shows their stdout
    is_output: bool = False


def parse_blocks(text: str) -> list[Block]:
    """Fenced blocks in file order; each `<!-- output -->` text block is attached to the python block before it."""
    lines = text.splitlines()
    blocks: list[Block] = []
    k = 0
    while k < len(lines):
        match = FENCE.match(lines[k])
        if not match:
            k += 1
            continue
        start = k
        k += 1
        body = []
        while k < len(lines) and lines[k].rstrip() != "```":
            body.append(lines[k])
            k += 1
        if k == len(lines):
            raise ValueError(f"tutorial line {start + 1}: unterminated code fence")
        k += 1
        prev = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        block = Block(match.group(1), start + 1, "\n".join(body) + "\n", is_output=prev == OUTPUT_MARK)
        if block.is_output:
            owner = blocks[-1] if blocks else None
            if block.lang != "text" or owner is None or owner.lang != "python" or owner.output is not None:
                raise ValueError(
                    f"tutorial line {start + 1}: an output block must be a ```text block right after a python block"
                )
            owner.output = block
        blocks.append(block)
    return blocks


# ---- sections ----------------------------------------------------------------------------------------------
SECTION = re.compile(r"^## (\d+)\. ")


def section_ranges(text: str) -> dict[int, tuple[int, int]]:
    """Section number -> (first line, last line), 1-based, from the `## N. Title` headings."""
    starts = [(int(m.group(1)), k) for k, line in enumerate(text.splitlines(), start=1) if (m := SECTION.match(line))]
    total = len(text.splitlines())
    return {n: (start, (starts[j + 1][1] - 1) if j + 1 < len(starts) else total) for j, (n, start) in enumerate(starts)}


def section_of(line: int, ranges: dict[int, tuple[int, int]]) -> int | None:
    return next((n for n, (first, last) in ranges.items() if first <= line <= last), None)


def _bound_and_used(code: str) -> tuple[set[str], set[str]]:
    bound, used = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, used


def undefined_names(text: str) -> dict[int, set[str]]:
    """Per section: the names its python blocks read that neither section 0 nor the section itself defines
    (what a reader who runs section 0 and then jumps to that section would get a NameError for)."""
    import builtins

    ranges = section_ranges(text)
    per_section: dict[int, tuple[set[str], set[str]]] = {}
    for block in parse_blocks(text):
        if block.lang == "python":
            bound, used = _bound_and_used(block.code)
            b, u = per_section.setdefault(section_of(block.line, ranges), (set(), set()))
            b |= bound
            u |= used
    setup = per_section.get(0, (set(), set()))[0] | set(dir(builtins))
    return {n: used - bound - setup for n, (bound, used) in per_section.items() if n and used - bound - setup}


def _module_bindings(code: str) -> dict[str, str]:
    """Names a block binds at module level -> what binds them ("import X.Y" for an import, else "assign"):
    function bodies, lambdas, classes and comprehensions have their own scopes and are not descended into."""
    found: dict[str, str] = {}
    scoped = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
              ast.DictComp, ast.GeneratorExp)  # fmt: skip

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = "assign"
        elif isinstance(node, ast.Import):
            for a in node.names:
                found[(a.asname or a.name).split(".")[0]] = f"import {a.name if a.asname else a.name.split('.')[0]}"
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                found[a.asname or a.name] = f"import {node.module}.{a.name}"
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            found[node.id] = "assign"
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found[node.name] = "assign"
        if not isinstance(node, scoped):
            for child in ast.iter_child_nodes(node):
                visit(child)

    for statement in ast.parse(code).body:
        visit(statement)
    return found


def rebound_setup_names(text: str) -> dict[int, set[str]]:
    """Per section: the names section 0 binds that the section binds again at module level (other than by
    importing the same object again). Empty means running the file in one namespace equals running each
    section in its own copy of section 0's namespace."""
    ranges = section_ranges(text)
    per_section: dict[int, dict[str, str]] = {}
    for block in parse_blocks(text):
        if block.lang == "python":
            per_section.setdefault(section_of(block.line, ranges), {}).update(_module_bindings(block.code))
    setup = per_section.get(0, {})
    rebound = {
        n: {name for name, how in names.items() if name in setup and not (how == setup[name] != "assign")}
        for n, names in per_section.items()
        if n
    }
    return {n: names for n, names in rebound.items() if names}


# ---- running (in a subprocess: `python tests/docs/test_tutorial.py --json OUT`) ------------------------------
def run_blocks(path: Path, sections: set[int] | None = None) -> list[dict]:
    """Execute the python blocks; per block: its line, section, stdout, seconds, and error (or None).

    Section 0's blocks run in one namespace; each later section in its own copy of the namespace section 0
    left (what a reader who runs section 0 and then jumps to that section has). `sections`: only section 0's
    blocks and those of these sections. A failing block stops its section, not the run."""
    setup: dict = {"__name__": "__tutorial__"}
    namespaces: dict[int | None, dict] = {0: setup}
    failed: set[int | None] = set()
    results = []
    text = path.read_text()
    ranges = section_ranges(text)
    for block in parse_blocks(text):
        section = section_of(block.line, ranges)
        if block.lang != "python" or section in failed or 0 in failed:
            continue
        if sections is not None and section not in {0, *sections}:
            continue
        namespace = namespaces.setdefault(section, dict(setup))  # first block of a section: a fresh copy
        # Pad with newlines so that tracebacks name the tutorial's own line numbers.
        code = compile("\n" * block.line + block.code, str(path.relative_to(REPO)), "exec")
        out = io.StringIO()
        start = time.perf_counter()
        error = None
        with contextlib.redirect_stdout(out):
            try:
                exec(code, namespace)
            except BaseException:  # report everything, including SystemExit from a CLI call
                error = traceback.format_exc()
        results.append(
            {"line": block.line, "section": section, "stdout": out.getvalue(),
             "seconds": time.perf_counter() - start, "error": error}
        )  # fmt: skip
        if error:
            failed.add(section)
    return results
