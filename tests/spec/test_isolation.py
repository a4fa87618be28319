"""spec is framework-neutral: importing it imports no framework (docs/design.md, "Layout and dependency
direction"). The backends' own isolation test is ModelTwin's (tests/twins/model.py)."""

from __future__ import annotations

import subprocess
import sys


def test_spec_imports_neither_framework():
    code = "import spec, sys; print(sorted(m for m in ('torch', 'jax', 'flax', 'triton') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr
