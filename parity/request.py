"""A validated check request: everything a check needs, settled before any model loads (parity/api.py
builds it; the whole-model, streamed and gradient checks run it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spec import ModelSpec

KEEP_IDS = 4096  # ids are stored in the report (and its JSON) up to this many, so a run can be replayed


@dataclass(frozen=True)
class Request:
    """A validated check: everything `check` needs, settled before any model loads."""

    directory: Path
    spec: ModelSpec
    ids: np.ndarray
    dtype: str
    kernels: str
    reference: str | None
    baseline: bool
    tp: int
    routing: str = "free"  # "free": each run routes itself; "teacher": the others get torch's expert choices
    ep: int = 1  # expert-parallel degree of the sharded runs (mixture-of-experts models)
