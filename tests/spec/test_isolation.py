"""Each backend imports and runs with the other framework absent (DESIGN.md: dependencies point one way).

A subprocess installs an import hook that makes the other framework unimportable, then loads the
default checkpoint and runs a forward pass; any import of the blocked framework fails the run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("blocked for this test: " + name)
        return None

sys.meta_path.insert(0, Block())
import spec
import {backend}
model = {backend}.from_pretrained(spec.default_checkpoint({cache!r}))
logits = model([[1, 2, 3]])
assert tuple(logits.shape) == (1, 3, 263), logits.shape
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r})
assert not leaked, leaked
print("ok")
"""


@pytest.mark.parametrize(
    ("backend", "blocked"), [("torch_impl", ("jax", "jaxlib", "flax")), ("jax_impl", ("torch", "triton"))]
)
def test_backend_runs_without_the_other_framework(backend, blocked, tmp_path):
    code = textwrap.dedent(SCRIPT).format(backend=backend, blocked=set(blocked), cache=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_spec_imports_neither_framework():
    code = "import spec, sys; print(sorted(m for m in ('torch', 'jax', 'flax', 'triton') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr
