"""Error metrics between a tested array and a reference array (both float32 numpy, same shape).

`max_rel` is the verdict metric: max|a - b| / max|b|, the worst elementwise error relative to the
component's scale. An elementwise relative error would be dominated by entries that happen to sit near zero
(every pre-activation has some), where even a correct low-precision result is "100% wrong". Sums are
accumulated in float64 so that the metric itself adds no error at the 1e-7 level float32 parity lives at.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

_TINY = float(np.finfo(np.float32).tiny)  # floor for a scale, so an all-zero reference does not divide by 0


@dataclass(frozen=True)
class Metrics:
    max_abs: float  # max |a - b|
    mean_abs: float  # mean |a - b|
    max_rel: float  # max |a - b| / max |b|: scale-relative, the verdict metric
    rms_rel: float  # ||a - b|| / ||b||
    cosine: float  # <a, b> / (||a|| ||b||), over the whole tensor
    finite: bool  # both arrays are free of NaN and inf
    scale: float  # max |b|
    # Logits only: KL(p_ref || p_test) of the softmax over the vocabulary, per position; top-1 agreement.
    kl_max: float | None = None
    kl_mean: float | None = None
    top1: float | None = None  # fraction of positions whose argmax agrees
    ref_rms: float | None = None  # rms of the reference logits (the KL bound's scale)

    def to_dict(self) -> dict:
        return {k: _json_float(v) for k, v in asdict(self).items()}


def _json_float(value):
    if isinstance(value, float) and not np.isfinite(value):
        return None if np.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def array_metrics(test: np.ndarray, ref: np.ndarray, *, chunk: int = 1 << 22) -> Metrics:
    """Metrics of `test` against `ref`; shapes must match (the comparison checks that first).

    Accumulated over `chunk`-element slices in float64, so a large logits tensor costs a few chunk-sized
    temporaries, not several float64 copies of the whole tensor.
    """
    if test.shape != ref.shape:
        raise ValueError(f"shape mismatch: {list(test.shape)} vs {list(ref.shape)}")
    a_all, b_all = np.asarray(test).reshape(-1), np.asarray(ref).reshape(-1)
    max_abs = sum_abs = sum_sq = aa = bb = ab = scale = 0.0
    finite = True
    for start in range(0, a_all.size, chunk):
        a = a_all[start : start + chunk].astype(np.float64)
        b = b_all[start : start + chunk].astype(np.float64)
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            finite = False
            break
        diff = a - b
        absdiff = np.abs(diff)
        max_abs = max(max_abs, float(absdiff.max()))
        sum_abs += float(absdiff.sum())
        sum_sq += float(np.dot(diff, diff))
        aa, bb, ab = aa + float(np.dot(a, a)), bb + float(np.dot(b, b)), ab + float(np.dot(a, b))
        scale = max(scale, float(np.abs(b).max()))
    if not finite:
        nan = float("nan")
        return Metrics(nan, nan, float("inf"), float("inf"), nan, False, nan)
    if a_all.size == 0:
        return Metrics(0.0, 0.0, 0.0, 0.0, 1.0, True, 0.0)
    norm_a, norm_b = np.sqrt(aa), np.sqrt(bb)
    if norm_a == 0.0 and norm_b == 0.0:
        cosine = 1.0
    elif norm_a == 0.0 or norm_b == 0.0:
        cosine = 0.0
    else:
        cosine = float(min(1.0, ab / (norm_a * norm_b)))
    return Metrics(
        max_abs=max_abs,
        mean_abs=sum_abs / a_all.size,
        max_rel=max_abs / max(scale, _TINY),
        rms_rel=float(np.sqrt(sum_sq)) / max(float(norm_b), _TINY),
        cosine=cosine,
        finite=True,
        scale=scale,
    )


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def logits_metrics(test: np.ndarray, ref: np.ndarray, *, chunk: int = 16) -> Metrics:
    """`array_metrics` plus, per position, KL(softmax(ref) || softmax(test)) and top-1 agreement.

    Positions are processed `chunk` at a time in float64, so a [B, T, 151936] vocabulary never needs more
    than a few chunk-sized float64 copies.
    """
    base = array_metrics(test, ref)
    if not base.finite:
        return base
    a = np.asarray(test).reshape(-1, test.shape[-1])  # [positions, V]
    b = np.asarray(ref).reshape(-1, ref.shape[-1])
    kls, agree, sum_sq = [], [], 0.0
    for start in range(0, a.shape[0], chunk):
        a64, b64 = a[start : start + chunk].astype(np.float64), b[start : start + chunk].astype(np.float64)
        la, lb = _log_softmax(a64), _log_softmax(b64)
        kls.append((np.exp(lb) * (lb - la)).sum(axis=-1))
        agree.append(a64.argmax(-1) == b64.argmax(-1))
        sum_sq += float(np.square(b64).sum())
    kl = np.maximum(np.concatenate(kls), 0.0)  # rounding can make a ~0 KL slightly negative
    return Metrics(
        **{
            **asdict(base),
            "kl_max": float(kl.max()),
            "kl_mean": float(kl.mean()),
            "top1": float(np.concatenate(agree).mean()),
            "ref_rms": float(np.sqrt(sum_sq / b.size)),
        }
    )
