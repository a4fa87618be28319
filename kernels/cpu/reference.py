"""The reference of kernels/cpu/gemv.c, gemm.c and gemm_amx.c: the same product in float64 numpy, for the tests to
hold the kernels to.

x [m, in] @ W (+ b) with W [out, in] ("rows", torch's layout) or [in, out] ("cols", Flax's; the GEMMs' only
layout), bfloat16 operands taken at their exact float32 values. Framework-neutral (numpy and ml_dtypes only).
"""

from __future__ import annotations

import numpy as np


def gemv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, layout: str) -> np.ndarray:
    """[m, out] float64: x @ W^T + b for "rows", x @ W + b for "cols"."""
    if layout not in ("rows", "cols"):
        raise ValueError(f"layout {layout!r} is not 'rows' or 'cols'")
    w64 = np.asarray(w, np.float32).astype(np.float64)
    out = np.asarray(x, np.float32).astype(np.float64) @ (w64.T if layout == "rows" else w64)
    return out if b is None else out + np.asarray(b, np.float32).astype(np.float64)
