"""What docs/tutorial.md names in backticks, and the rules for its formula -> code mapping tables.

- References: every `path/file.py::Symbol.attr` in backticks must name an existing file in which the symbol
  resolves (a module-level definition, a class member, or an attribute a method assigns as `self.attr`), and
  must import and getattr at run time down to its last class-level member (`resolve_reference`). Bare paths in
  backticks (BARE_PATH) must exist.
- Mapping tables (header `| formula | torch_impl | jax_impl | kernel | checkpoint tensor |`): each row names
  code in both frameworks' columns, and no column names the other framework's code (`mapping_table_problems`).
- Checkpoint tensor names (TENSOR_NAME: `model.layers.{i}.mlp.gate_proj.weight`, ...) and parity component
  names (COMPONENT: `layers.{i}.mlp.act`, `final_norm`, ...) are found here and checked against the code in
  test_tutorial_references.py.
"""

from __future__ import annotations

import ast
import importlib
import re

from tests.docs.tutorial_blocks import REPO

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
