"""What a reader of docs/tutorial.md sees rendered: its pictures, its mermaid diagrams, its line length.

IMAGE finds the pictures the tutorial shows (`![..](images/NAME)`); `mermaid_problems` is what keeps a mermaid
flowchart from rendering, as far as a static look can tell; `long_lines` the lines too long to read. The tests
are in test_tutorial_rendering.py.
"""

from __future__ import annotations

import re

from tests.docs.tutorial_blocks import parse_blocks

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
