"""docs/tutorial.md is executed and cross-checked here, so that it cannot drift from the code.

- Every ```python block runs, in file order, in a fresh subprocess whose working directory is the repository
  root (as a reader's fresh session would: the tutorial's first block sets TRITON_INTERPRET and the JAX
  device count before triton and JAX start). Section 0's blocks share one namespace; every later section
  runs in its own copy of the namespace section 0 left, so a section that reads a name only an earlier
  section defines fails with a NameError here, as it would for a reader who runs section 0 and jumps to it.
  No section rebinds a name section 0 defines (checked statically), so running the whole file in one
  namespace, as a reader going through it in order does, is the same program. The subprocess gets an empty
  cache directory, so the built-in checkpoint is written from scratch, as on a fresh clone. ```console /
  ```text / ```mermaid blocks are never executed.
- Output: a ```text block preceded by the line `<!-- output -->` shows the stdout of the python block just
  before it and must say the same thing on any machine (`output_mismatch`, rules beside it: words exactly,
  whitespace and column widths ignored, integers exactly, decimals to the digits shown, and a parity
  report's measured errors within the bound the report prints beside them; a line `...` skips any number
  of lines, `...` inside a line matches any text). A python block that prints must be followed by such a
  block, so every printed line of the tutorial is real output. Numbers the prose states are asserted
  inside the blocks that compute them.
- References: every `path/file.py::Symbol.attr` in backticks must name an existing file in which the symbol
  resolves (a module-level definition, a class member, or an attribute a method assigns as `self.attr`), and
  must import and getattr at run time down to its last class-level member. Bare paths in backticks must exist.
- Mapping tables (header `| formula | torch_impl | jax_impl | kernel | checkpoint tensor |`): each row names
  code in both frameworks' columns, and no column names the other framework's code.
- Checkpoint tensor names (`model.layers.{i}.mlp.gate_proj.weight`, ...) must be rows of spec.param_table for
  the default spec (a few, listed in VARIANT_ONLY, for the untied / q-k-v-bias variant of it) or for one of the
  family and MoE checkpoints of tests/hf_models.py (sections 10 to 15); parity component names
  (`layers.{i}.mlp.act`, `final_norm`, ...) must be components some family records (parity.forward_order).
- Pictures: every image the tutorial shows (`![..](images/NAME)`) is committed under docs/images/ as a PNG, every
  committed image is shown, a python block draws it again (into a scratch directory, or into docs/images/
  with TUTORIAL_IMAGES=docs/images), and a `$ python -m parity ...` console line that draws docs/images/NAME
  is executed word for word by a python block. Every ```mermaid block is a well-formed flowchart (a
  direction, balanced quotes and brackets, each `subgraph` closed) whose `layers.i.NAME` labels are parity
  components.
- Sections stand alone: every name a section's code reads is defined in section 0 or in that section
  (statically, and at run time by the per-section namespaces above). Process state (imported modules, JAX's
  caches, torch's global seed) is shared by the sections of one run; `TUTORIAL_FRESH_PROCESSES=1` adds one
  test per section that runs section 0 and that section alone in a fresh process (15-25 s each: not in CI).

Run `python tests/docs/test_tutorial.py` to execute the tutorial and print each block's output and any
mismatch; `--sections=10,12` runs section 0 and then only those sections; `--update` rewrites the output
blocks that no longer match (review the diff before committing).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "tutorial.md"
OUTPUT_MARK = "<!-- output -->"
FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
# Checkpoint tensor names that only exist in a variant of the default spec (untied head, q/k/v bias).
VARIANT_ONLY = {
    "lm_head.weight",
    "model.layers.{i}.self_attn.q_proj.bias",
    "model.layers.{i}.self_attn.k_proj.bias",
    "model.layers.{i}.self_attn.v_proj.bias",
}
RUN_TIMEOUT_S = 600  # a hang guard for the tutorial's subprocess, not a speed check


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


# ---- comparing outputs ---------------------------------------------------------------------------------------
# A shown output block matches what its python block printed when, line by line, the two say the same thing.
# Lines are compared as tokens, so whitespace and column widths never count (a table whose column narrowed on
# another machine is the same table). Words and punctuation must be equal. Each number agrees within the
# tolerance that applies to it:
#
# - an integer (no point, no exponent: a count, an id, a shape, a FLOP count) exactly;
# - a decimal to the digits the text shows: within one unit of its last printed digit (a value that sits on
#   a rounding boundary prints one unit apart on another machine), and never by more than 1% of it;
# - a measured error in a table whose header has `<=` columns (the parity report): within the bound the row
#   prints beside it, on both sides. Such an error is float32 rounding noise: its digits depend on the
#   processor and the BLAS library (transformers and torch_impl gave a 1-cos of 0 on one CPU and 1.11e-16 on
#   another), while the tolerance the report states for it, and its verdict, do not. The columns before a
#   `<=` column (back to the previous one) are its group: max_abs, mean_abs and max_rel share max_rel's
#   bound, 1-cos and KL have their own. An error above its bound on either side (a bug's magnitude, as in
#   section 7's FAIL rows) is compared to its digits like any decimal; so are the bounds themselves.
#
# `...` alone on a line skips any number of lines; `...` inside a line matches any tokens.
TOKEN = re.compile(
    r"(?P<number>(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.]))"  # not a digit inside a name
    r"|(?P<ellipsis>\.\.\.)|(?P<word>\w+)|(?P<mark>\S)"
)
REL_CAP = 1e-2  # a decimal never agrees to worse than 1%, whatever digits it shows
BOUND = "<="  # a table column of bounds: the columns before it hold the errors it bounds


def tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) tokens of one line: number, ellipsis, word or a single punctuation mark."""
    return [(m.lastgroup, m.group()) for m in TOKEN.finditer(text)]


def _digit_unit(shown: str) -> float:
    """One unit of the last digit `shown` prints: 0.01 for '1.31', 1e-3 for '1.31e-01', 0 for an integer."""
    mantissa, _, exponent = shown.lower().partition("e")
    if "." not in mantissa and not exponent:
        return 0.0
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def numbers_agree(shown: str, printed: str) -> bool:
    """`printed` agrees with `shown` to the digits `shown` prints (integers exactly), at most 1% apart."""
    x, y = float(shown), float(printed)
    if x == y:
        return True
    tolerance = min(_digit_unit(shown), REL_CAP * abs(x))
    return abs(x - y) <= tolerance * (1 + 1e-9)  # 1e-9: the binary representation of the decimal unit


def _tokens_match(shown: list[tuple[str, str]], printed: list[tuple[str, str]]) -> bool:
    def match(i: int, j: int) -> bool:
        if i == len(shown):
            return j == len(printed)
        kind, text = shown[i]
        if kind == "ellipsis":  # any run of tokens, including none
            return any(match(i + 1, k) for k in range(j, len(printed) + 1))
        if j == len(printed) or printed[j][0] != kind:
            return False
        same = numbers_agree(text, printed[j][1]) if kind == "number" else text == printed[j][1]
        return same and match(i + 1, j + 1)

    return match(0, 0)


@dataclass
class Row:
    """A row of a right-aligned table: its cells by column index, and the table's header fields."""

    cells: dict[int, str]
    header: list[str]

    def bound_of(self, column: int) -> float | None:
        """The bound printed in this row for the error in `column`, or None if the column is not an error."""
        if column == 0 or self.header[column] == BOUND:
            return None
        after = next((k for k in range(column + 1, len(self.header)) if self.header[k] == BOUND), None)
        cell = self.cells.get(after) if after is not None else None
        try:
            return float(cell) if cell is not None else None
        except ValueError:
            return None


def table_rows(lines: list[str]) -> list[Row | None]:
    """Per line: a Row when the line is a row of a table with `<=` columns, else None.

    A table is a header line with a `<=` field, then the lines up to the next blank one. Its first column is
    left-aligned and the others right-aligned (parity/report.py), so a cell is the run of fields that ends
    where a header field ends. A line that cannot be cut that way is compared as plain tokens.
    """
    rows: list[Row | None] = [None] * len(lines)
    header: list[re.Match] | None = None
    for k, line in enumerate(lines):
        fields = list(re.finditer(r"\S+", line))
        if not fields:
            header = None
        elif BOUND in (f.group() for f in fields) and not any(_is_number(f.group()) for f in fields):
            header = fields  # names and `<=`, no number: a header (a row always holds a number)
        elif header is not None:
            rows[k] = _cut(fields, header)
    return rows


def _is_number(text: str) -> bool:
    return [kind for kind, _ in tokens(text)] == ["number"]


def _cut(fields: list[re.Match], header: list[re.Match]) -> Row | None:
    ends = {f.end(): column for column, f in enumerate(header)}
    cells, pending = {0: fields[0].group()}, []
    for field in fields[1:]:
        pending.append(field.group())
        column = ends.get(field.end())
        if column is not None and column > max(cells):
            cells[column], pending = " ".join(pending), []
    return Row(cells, [f.group() for f in header]) if not pending else None


def _rows_match(shown: Row, printed: Row) -> bool:
    if sorted(shown.cells) != sorted(printed.cells) or shown.header != printed.header:
        return False
    for column, text in shown.cells.items():
        other = printed.cells[column]
        bounds = shown.bound_of(column), printed.bound_of(column)
        if None not in bounds and _within(text, bounds[0]) and _within(other, bounds[1]):
            continue  # both readings of a measured error are inside the tolerance the report states for it
        if not _tokens_match(tokens(text), tokens(other)):
            return False
    return True


def _within(cell: str, bound: float) -> bool:
    try:
        return abs(float(cell)) <= bound
    except ValueError:  # "-" (a non-finite metric) or a word
        return False


def _line_matches(shown: str, printed: str, shown_row: Row | None, printed_row: Row | None) -> bool:
    if shown_row is not None and printed_row is not None and "..." not in shown:
        return _rows_match(shown_row, printed_row)
    return _tokens_match(tokens(shown), tokens(printed))


def output_mismatch(expected: str, actual: str) -> str | None:
    """None when `actual` matches the shown `expected` output, else the first line that does not."""
    exp, act = expected.rstrip("\n").splitlines(), actual.rstrip("\n").splitlines()
    exp_rows, act_rows = table_rows(exp), table_rows(act)

    def line(i: int, j: int) -> bool:
        return _line_matches(exp[i], act[j], exp_rows[i], act_rows[j])

    def match(i: int, j: int) -> bool:  # exp[i:] against act[j:]; "..." lines skip any number of lines
        if i == len(exp):
            return j == len(act)
        if exp[i].strip() == "...":
            return any(match(i + 1, jj) for jj in range(j, len(act) + 1))
        return j < len(act) and line(i, j) and match(i + 1, j + 1)

    if match(0, 0):
        return None
    for i, text in enumerate(exp):
        if text.strip() == "..." or i >= len(act) or not line(i, i):
            got = act[i] if i < len(act) else "<end of output>"
            return f"shown line {i + 1}: {text!r}\n  printed:      {got!r}"
    return f"the block printed {len(act) - len(exp)} more line(s), from {act[len(exp)]!r}"


# ---- references ----------------------------------------------------------------------------------------------
REFERENCE = re.compile(r"`([\w./-]+\.py)::([\w.]+)`")
BARE_PATH = re.compile(r"`((?:spec|torch_impl|jax_impl|kernels|parity|tests|docs|benchmarks)/[\w./-]*)`")
TENSOR_NAME = re.compile(r"`((?:model|lm_head|gpt_neox)\.[\w.{}]+\.(?:weight|bias))`")
COMPONENT = re.compile(r"`((?:layers\.(?:\{i\}|\d+)\.[\w.]+)|embed|final_norm|logits)`")


def _definitions(body: list[ast.stmt]) -> dict[str, ast.AST]:
    found: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        found[name.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                found[(alias.asname or alias.name).split(".")[0]] = node
    return found


def _self_attributes(cls: ast.ClassDef) -> set[str]:
    """Attributes a method of `cls` assigns as `self.<name> = ...` (instance attributes, e.g. submodules)."""
    names = set()
    for node in ast.walk(cls):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    names.add(sub.attr)
    return names


def resolve_reference(path: str, symbol: str) -> str | None:
    """None when `path::symbol` exists (statically, then at run time), else what is wrong."""
    file = REPO / path
    if not file.is_file():
        return f"{path}: no such file"
    scope: ast.AST = ast.parse(file.read_text())
    parts = symbol.split(".")
    static_depth = len(parts)  # how many parts getattr must reach at run time
    for k, part in enumerate(parts):
        found = _definitions(getattr(scope, "body", [])).get(part) if not isinstance(scope, ast.FunctionDef) else None
        if found is None:
            if isinstance(scope, ast.ClassDef) and k == len(parts) - 1 and part in _self_attributes(scope):
                static_depth = k  # an instance attribute: the class has no such member to getattr
                break
            return f"{path}::{symbol}: {part!r} is not defined there"
        scope = found
    module_name = path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    try:
        obj = importlib.import_module(module_name)
    except Exception as err:  # any import failure is the finding
        return f"{path}: cannot import {module_name}: {err!r}"
    for part in parts[:static_depth]:
        if not hasattr(obj, part):
            return f"{path}::{symbol}: {module_name} has no attribute path up to {part!r} at run time"
        obj = getattr(obj, part)
    return None


def mapping_table_problems(text: str) -> list[str]:
    """Rows of the formula -> code tables must name code in the right columns."""
    problems, header = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if set("".join(cells)) <= set("-: ") or [c.lower() for c in header[:1]] != ["formula"]:
            continue
        if [c.lower() for c in header] != ["formula", "torch_impl", "jax_impl", "kernel", "checkpoint tensor"]:
            problems.append(f"line {number}: mapping table header {header}")
            continue
        formula, torch_cell, jax_cell, kernel_cell, tensor_cell = cells
        torch_refs, jax_refs = REFERENCE.findall(torch_cell), REFERENCE.findall(jax_cell)
        if not torch_refs or not jax_refs:
            problems.append(f"line {number}: row {formula!r} names no code in the torch_impl or jax_impl column")
        if any(
            p.startswith(("jax_impl/", "kernels/pallas/", "kernels/triton/"))
            for p, _ in torch_refs
            if p != "kernels/triton/reference.py"
        ):
            problems.append(f"line {number}: the torch_impl column names non-torch code")
        if any(
            p.startswith(("torch_impl/", "kernels/triton/", "kernels/pallas/"))
            for p, _ in jax_refs
            if p != "kernels/pallas/reference.py"
        ):
            problems.append(f"line {number}: the jax_impl column names non-jax code")
        kernel_refs = REFERENCE.findall(kernel_cell)
        if any(not p.startswith("kernels/") or p.endswith("reference.py") for p, _ in kernel_refs):
            problems.append(f"line {number}: the kernel column names something other than a fused kernel")
        if not kernel_refs and kernel_cell != "—" and not kernel_cell.startswith("— "):
            problems.append(f"line {number}: the kernel column must name a kernel or start with '—'")
        if not TENSOR_NAME.findall(tensor_cell) and not tensor_cell.startswith("—"):
            problems.append(f"line {number}: the checkpoint column must name tensors or start with '—'")
    return problems


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


def test_every_referenced_file_and_symbol_exists():
    text = TUTORIAL.read_text()
    references = sorted(set(REFERENCE.findall(text)))
    assert len(references) >= 40, "the mapping tables name too few symbols: did the reference syntax change?"
    problems = [p for p in (resolve_reference(path, symbol) for path, symbol in references) if p]
    paths = set(BARE_PATH.findall(text))
    problems += [f"{p}: no such file or directory" for p in sorted(paths) if not (REPO / p).exists()]
    assert not problems, "\n".join(problems)


def test_mapping_tables_put_code_in_the_right_columns():
    text = TUTORIAL.read_text()
    assert text.count("| formula | torch_impl | jax_impl | kernel | checkpoint tensor |") >= 6
    problems = mapping_table_problems(text)
    assert not problems, "\n".join(problems)


def _family_specs() -> dict:
    """The specs of tests/hf_models.py's family and MoE checkpoints (sections 10 to 15 name their tensors)."""
    import spec
    from tests.hf_models import FAMILY_CONFIGS, MOE_CONFIGS, build_hf_model

    names = [*FAMILY_CONFIGS, *MOE_CONFIGS]
    return {name: spec.ModelSpec.from_hf_config(build_hf_model(name).config.to_dict()) for name in names}


def test_checkpoint_tensor_names_are_in_the_parameter_table():
    import spec

    default = spec.DEFAULT_SPEC
    variant = dataclasses.replace(default, tie_word_embeddings=False, attention_bias=True)

    def names(model_spec) -> set[str]:
        return {e.name for e in spec.param_table(model_spec)}

    def expand(name: str) -> set[str]:
        return {name.replace("{i}", str(i)) for i in range(2)}  # every test spec here has >= 2 layers

    families = set().union(*(names(s) for s in _family_specs().values()))
    used = set(TENSOR_NAME.findall(TUTORIAL.read_text()))
    assert "model.embed_tokens.weight" in used and "model.layers.{i}.mlp.gate_proj.weight" in used
    problems = []
    for name in sorted(used):
        # A name the default spec (or its untied/bias variant) lacks must be a family checkpoint's.
        table = (names(variant) if name in VARIANT_ONLY else names(default)) | families
        if not expand(name) <= table:
            problems.append(f"{name!r} is not in spec.param_table of the default spec, its variant, or a family's")
    assert not problems, "\n".join(problems)


def test_parity_component_names_exist():
    from parity.components import forward_order

    order = set(forward_order(2))  # every component any family's layers record
    used = set(COMPONENT.findall(TUTORIAL.read_text()))
    assert {"embed", "logits", "layers.{i}.x1", "layers.{i}.attn_post_norm"} <= used
    unknown = sorted(n for n in used if not {n.replace("{i}", str(i)) for i in range(2)} <= order)
    assert not unknown, f"not parity components: {unknown}"


IMAGE = re.compile(r"!\[[^\]]*\]\(images/([\w.-]+)\)")
MERMAID_DIRECTIONS = {"TB", "TD", "BT", "LR", "RL"}


def mermaid_problems(code: str) -> list[str]:
    """What keeps a mermaid flowchart from rendering, as far as a static look can tell."""
    lines = [line.strip() for line in code.splitlines() if line.strip() and not line.strip().startswith("%%")]
    if not lines:
        return ["empty diagram"]
    kind, _, direction = lines[0].partition(" ")
    problems = [] if kind in {"flowchart", "graph"} and direction.strip() in MERMAID_DIRECTIONS else [
        f"first line {lines[0]!r} is not `flowchart <direction>`"
    ]  # fmt: skip
    depth = 0
    for line in lines[1:]:
        if line.count('"') % 2:
            problems.append(f"unbalanced quotes: {line!r}")
        outside = re.sub(r'"[^"]*"', '""', line)  # brackets inside a quoted label are text
        for pair in ("[]", "()", "{}"):
            if outside.count(pair[0]) != outside.count(pair[1]):
                problems.append(f"unbalanced {pair}: {line!r}")
        if line.startswith("subgraph "):
            depth += 1
        elif line == "end":
            depth -= 1
            if depth < 0:
                problems.append("`end` without a subgraph")
    if depth > 0:
        problems.append(f"{depth} subgraph(s) not closed")
    return problems


def test_images_are_committed_shown_and_redrawn():
    text = TUTORIAL.read_text()
    blocks = parse_blocks(text)
    shown = set(IMAGE.findall(text))
    committed = {p.name for p in (REPO / "docs" / "images").iterdir()}
    assert shown, "the tutorial shows no image: did the image syntax change?"
    assert shown == committed, (
        f"shown but not committed: {shown - committed}; committed, not shown: {committed - shown}"
    )
    python = "\n".join(b.code for b in blocks if b.lang == "python")
    for name in sorted(shown):
        assert (REPO / "docs" / "images" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG"
        assert f'"{name}"' in python, f"no python block draws {name}"
        commands = [
            line.strip().removeprefix("$ ").strip()
            for b in blocks
            if b.lang == "console"
            for line in b.code.splitlines()
            if line.strip().startswith("$ python -m parity") and f"docs/images/{name}" in line
        ]
        assert all(f'"{c}"' in python for c in commands), f"the command drawing {name} is not run by any python block"


def test_mermaid_diagrams_are_well_formed():
    from parity.components import forward_order

    blocks = [b for b in parse_blocks(TUTORIAL.read_text()) if b.lang == "mermaid"]
    assert len(blocks) >= 3
    problems = [f"line {b.line}: {p}" for b in blocks for p in mermaid_problems(b.code)]
    order = set(forward_order(2))
    for b in blocks:
        for name in re.findall(r"\blayers\.i\.[\w.]*\w", b.code):
            if not {name.replace(".i.", f".{i}.") for i in range(2)} <= order:
                problems.append(f"line {b.line}: {name} is not a parity component")
    assert not problems, "\n".join(problems)
    assert mermaid_problems("flowchart LR\n  a[x] --> b\n") == []
    assert mermaid_problems("flowchart\n  a[x --> b\n  subgraph s\n")  # no direction, a bracket open, no end


def long_lines(text: str) -> list[str]:
    """Lines over 120 characters outside tables (a Markdown table row cannot wrap) and outside output blocks,
    where a printed line may reach 200 (a parity verdict line is one line of output)."""
    lines = text.splitlines()
    limit = [120] * len(lines)
    for block in parse_blocks(text):
        if block.is_output:
            for k in range(block.line, block.line + len(block.code.rstrip("\n").splitlines())):
                limit[k] = 200
    return [
        f"line {k + 1}: {len(line)} > {limit[k]}"
        for k, line in enumerate(lines)
        if len(line) > limit[k] and not line.startswith("|")
    ]


def test_lines_are_short():
    assert not long_lines(TUTORIAL.read_text())


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


TABLE = """\
torch vs hf (float32)
component    max_abs  mean_abs  max_rel        <=     1-cos        <=  KL        <=   top1  verdict
embed              0         0        0  1.00e-05         0  5.00e-11                            ok
final_norm         0         0        0  1.73e-05  1.11e-16  1.50e-10                            ok
logits             0         0        0  1.73e-05  1.11e-16  1.50e-10   0  2.90e-12  1.000       ok
"""


def _printed(table: str, replace: dict[str, str], at: dict[tuple[int, int], str] | None = None) -> str:
    """`table` as another machine might print it: some cells replaced, the columns re-aligned to fit.

    `replace` maps a cell's text to a new one wherever it occurs; `at` sets the cell at (data row, column).
    Alignment as parity/report.py's: the first column left-aligned, the others right-aligned.
    """
    lines = table.splitlines()
    rows = [lines[1].split()] + [line.split() for line in lines[2:]]
    for r, row in enumerate(rows[1:]):
        row[:] = [replace.get(cell, cell) for cell in row]
        if len(row) < len(rows[0]):  # the empty KL, KL bound and top1 cells of a non-logits row
            row[-1:-1] = [""] * (len(rows[0]) - len(row))
        for (at_row, column), text in (at or {}).items():
            if at_row == r:
                row[column] = text
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    aligned = [
        "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    return "\n".join([lines[0], *aligned]) + "\n"


def test_output_matching_rules():
    # Numbers outside tables: integers exactly, decimals to one unit of their last digit (at most 1%).
    assert output_mismatch("a 1.00e-05 b\n", "a 1.00e-05 b\n") is None
    assert output_mismatch("max_rel 1.31e-01", "max_rel 1.32e-01") is None  # a rounding boundary: one unit
    assert output_mismatch("max_rel 1.31e-01", "max_rel 1.33e-01") is not None
    assert output_mismatch("max_rel 1.31e-01", "max_rel 2.00e-01") is not None  # a wrong number fails
    assert output_mismatch("RMS 1.0000, mean 0.9899", "RMS 0.9999, mean 0.9899") is None
    assert output_mismatch("RMS 1.0000, mean 0.9899", "RMS 1.0000, mean 0.9897") is not None
    assert output_mismatch("[-3.0, 1.0]", "[-3.0, 1.1]") is not None  # 1%, though 1.0 shows one decimal
    assert output_mismatch("[-3.0, 1.0]", "[3.0, 1.0]") is not None  # the sign is part of the number
    assert output_mismatch("torch 384, jax 384", "torch 384, jax 385") is not None  # integers exactly
    assert output_mismatch("FLOPs 9,663,676,416", "FLOPs 9,663,676,417") is not None
    assert output_mismatch("1-cos 1.11e-16", "1-cos 0") is not None  # outside a table no bound is stated
    # Words, punctuation and digits inside names exactly; whitespace never counts.
    assert output_mismatch("PASS", "FAIL") is not None
    assert output_mismatch("layers.0.x1 ok", "layers.1.x1 ok") is not None
    assert output_mismatch("[[0.8485 1.1314]]", "[[ 0.8485  1.1314]]") is None
    assert output_mismatch("a  b", "a b") is None and output_mismatch("ab", "a b") is not None
    assert output_mismatch("1 2", "12") is not None
    # `...` lines skip lines, `...` in a line skips tokens; line counts must agree.
    assert output_mismatch("head\n...\ntail", "head\nx\ny\ntail") is None
    assert output_mismatch("check: ...", "check: /tmp/abc") is None
    assert output_mismatch("a\nb", "a") is not None and output_mismatch("a", "a\nb") is not None


def test_table_errors_agree_within_their_stated_bounds():
    assert output_mismatch(TABLE, TABLE) is None
    # Another machine: the exact 0 reads 1e-16 and vice versa, the columns narrow or widen: the same result.
    assert output_mismatch(TABLE, _printed(TABLE, {"1.11e-16": "0"})) is None
    noise = _printed(TABLE, {"1.11e-16": "2.22e-15"}, at={(0, 1): "2.38e-07", (2, 7): "7.73e-16"})
    assert output_mismatch(TABLE, noise) is None  # max_abs 2.38e-07 <= 1.00e-05 (max_rel's), KL <= 2.90e-12
    assert output_mismatch(TABLE, _printed(TABLE, {}, at={(0, 1): "3.00e-05"})) is not None  # max_abs > 1e-5
    assert output_mismatch(TABLE, _printed(TABLE, {}, at={(2, 7): "5.00e-12"})) is not None  # KL > 2.90e-12
    # An error outside its bound on either side is a different result, even where the verdict was not edited.
    assert output_mismatch(TABLE, _printed(TABLE, {"1.11e-16": "2.00e-10"})) is not None  # 1-cos > 1.50e-10
    assert output_mismatch(TABLE, _printed(TABLE, {"1.11e-16": "3.00e-03"})) is not None
    # The bounds themselves, top1 and the verdict are compared like any other number or word.
    assert output_mismatch(TABLE, _printed(TABLE, {"1.50e-10": "1.50e-08"})) is not None
    assert output_mismatch(TABLE, _printed(TABLE, {"2.90e-12": "2.90e-10"})) is not None
    assert output_mismatch(TABLE, _printed(TABLE, {"1.000": "0.875"})) is not None
    assert output_mismatch(TABLE, _printed(TABLE, {"ok": "FAIL"})) is not None
    # Errors above their bound (a bug's magnitude) agree only to their digits.
    fail = TABLE.replace("1.11e-16  1.50e-10", "1.02e+00  1.50e-10", 1)
    assert output_mismatch(fail, _printed(fail, {"1.02e+00": "1.03e+00"})) is None
    assert output_mismatch(fail, _printed(fail, {"1.02e+00": "1.10e+00"})) is not None
    assert output_mismatch(fail, _printed(fail, {"1.02e+00": "0"})) is not None


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
    sys.path.insert(0, str(REPO))  # the script's own directory is tests/docs; the tutorial imports from the root
    os.chdir(REPO)
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
