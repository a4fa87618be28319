"""docs/tutorial.md's pictures, diagrams and line length (the helpers are in tutorial_rendering.py).

- Pictures: every image the tutorial shows (`![..](images/NAME)`) is committed under docs/images/ as a PNG, every
  committed image is shown, a python block draws it again (into a scratch directory, or into docs/images/
  with TUTORIAL_IMAGES=docs/images), and a `$ python -m parity ...` console line that draws docs/images/NAME
  is executed word for word by a python block. Every ```mermaid block is a well-formed flowchart (a
  direction, balanced quotes and brackets, each `subgraph` closed) whose `layers.i.NAME` labels are parity
  components.
- Lines: at most 120 characters, outside tables and output blocks (`long_lines`).
"""

from __future__ import annotations

import re

from tests.docs.tutorial_blocks import REPO, TUTORIAL, parse_blocks
from tests.docs.tutorial_rendering import IMAGE, long_lines, mermaid_problems


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


def test_lines_are_short():
    assert not long_lines(TUTORIAL.read_text())
