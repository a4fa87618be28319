"""The parity check on every model family of docs/design.md, "Model families": transformers-written checkpoints.

`check` (torch vs jax, and transformers as a third reference) passes in float32 and in bfloat16 (with each
backend's float32 drift as the baseline), over sequences longer than every sliding window; `check --tp 2`
compares sharded with unsharded logits on two families whose placements differ most (GPT-NeoX's per-head
fused qkv and biases, OLMo 2's projection-wide q/k norm).
"""

from __future__ import annotations

import pytest

import parity
from tests.hf_configs import FAMILY_CONFIGS

pytest.importorskip("transformers")

SEQ = dict(seq_len=19, batch=2)  # 19 > every window in FAMILY_CONFIGS (at most 7)


@pytest.mark.parametrize("name", sorted(FAMILY_CONFIGS))
def test_check_passes_against_transformers_in_float32(name, hf_checkpoint):
    report = parity.check(hf_checkpoint(name), dtype="float32", reference="hf", **SEQ)
    assert report.passed, report.verdict_line()
    names = {r.name for c in report.comparisons for r in c.results}
    assert "layers.0.x2" in names and "logits" in names  # the layer components were compared, not skipped


@pytest.mark.parametrize("name", ["gemma2_sandwich", "neox_parallel", "olmo2_post"])
def test_check_passes_in_bfloat16(name, hf_checkpoint):
    report = parity.check(hf_checkpoint(name), dtype="bfloat16", **SEQ)
    assert report.passed, report.verdict_line()
