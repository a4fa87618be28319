"""`linear(x, weight, bias)` and the `Linear` module built on it: one 2-D product whatever x's leading dims,
through the library this machine runs fastest for that product.

Mirrors jax_impl/linear.py, where XLA's dot needs no 2-D reshape but has a choice of its own. Two CPU matters:

- 2-D, always: F.linear on a 3-D [B, T, in] input goes through a batched-matmul path; for a decode step
  (T = 1) the same product as a 2-D [tokens, in] GEMV streams the weight faster.
- Which library, measured. A CPU inference product can run through
  - F.linear (MKL's GEMM/GEMV in this torch build for float32),
  - oneDNN's matmul (`torch.ops.mkldnn._linear_pointwise`, the op torch.compile's CPU backend emits),
  - for bfloat16, "upcast_blocks": bfloat16 storage, float32 compute, the weight converted UPCAST_BYTES of rows at a
    time into a float32 block that stays in cache and multiplied by float32 GEMM, the result rounded once (on a
    processor without bfloat16 instructions, AVX2, the libraries' bfloat16 GEMM is several times slower than that;
    with them, AVX512_BF16 and AMX, several times faster: docs/benchmarks.md),
  - for few rows (a decode step's), the project's own CPU kernel "gemv" (kernels/cpu/gemv.c: one pass over the
    weight, float32 or bfloat16 storage, float32 compute), where the libraries' matrix-vector code streams a chain
    of decode-sized weights below what the machine can read,
  - for more rows of bfloat16 (a prompt's) on a processor with AMX, the project's tile kernel "gemm"
    (kernels/cpu/gemm_amx_rows.c), which reads the weight in place where the libraries' plain-weight GEMM repacks
    it on every call; on one with AVX-512, "upcast", the same arithmetic as upcast_blocks in the project's kernel
    (kernels/cpu/gemm.c's float32 loops, each bf16 value widened as the weight is packed: jax_impl's form of the
    same name), for processors whose bf16 instructions, where they have any, run below their float32 FMAs.
  Every path accumulates in float32 and computes x @ W^T + b up to summation order; which is faster depends on the
  processor (MKL's GEMV is slow on some AMD processors and the faster one on Intel). So the first product of each
  (rows, in, out, dtype, bias) times the paths that apply (spec/path_choice.py) and the process keeps the fastest
  (a kernel, where one applies, unless another path beats it in every round, or above STREAM_ROWS rows by the
  median round: `PATHS`; there, one choice per power-of-two bucket of rows: `rows_key`). A decode-sized product
  (few rows) is timed over distinct weights of its shape, taken out of the caches before each pass
  (kernels/cpu/evict.py), as a decode step finds its weights in memory (a model's own inside `resident_weights`,
  which generate enters); a prefill-sized one, which is compute-bound, on the weight it was called with (its first
  STREAM_BYTES of output rows, where it is larger: a tied head's table, whose slowest path would otherwise cost a
  second). A weight under MIN_CHOICE_BYTES (a test model's) stays in cache and keeps F.linear without measuring.
  `PATHS.forced("onednn")` or `linear(..., path=...)` pins a path (tests, comparisons).

Autograd (neither the oneDNN op nor the kernels have a backward; training keeps the autograd path), non-CPU tensors,
non-contiguous weights and dtypes other than float32 and bfloat16 always take F.linear. The parameters are
nn.Linear's own (`weight` [out, in], `bias`), so checkpoints load unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import flop_counter
from torch.utils._python_dispatch import _disable_current_modes

from kernels.cpu import torch_gemm, torch_gemv
from kernels.cpu.evict import evicting
from spec.choice_rules import COMPUTE_BOUND
from spec.path_choice import Pass, PathChoice, Timed

# The first a key offers is its default, which another path replaces only by beating it in every timed round: a
# kernel where one applies (each reads the weight in its stored layout: gemv and gemm in place, upcast packing panels
# of it as it goes), else F.linear. Three rounds, not two: where two paths stream within a few percent of each other,
# two rounds let noise move one product off the kernel, and with it the layer's one call (a slower decode;
# docs/benchmarks.md). A prompt's product, whose passes swing more, takes the median of three rounds instead
# (spec/choice_rules.py's COMPUTE_BOUND).
PATHS = PathChoice("torch_impl.linear", ("gemv", "gemm", "upcast", "f_linear", "onednn", "upcast_blocks"), repeats=3)
STREAM_ROWS = 8  # up to this many token rows a product streams its weight (memory-bound): timed out of cache
STREAM_BYTES = 64 << 20  # the weights one such timing pass streams, evicted from the caches before it
MAX_COPIES = 16  # at most this many distinct weights per pass: small products stay cheap to time
MIN_CHOICE_BYTES = 256 << 10  # smaller weights (test models) stay in cache and keep F.linear unmeasured
DTYPES = (torch.float32, torch.bfloat16)
UPCAST_BYTES = 4 << 20  # float32 weight rows upcast_blocks converts at a time: a block that stays in cache


@functools.cache
def _onednn_available(dtype: torch.dtype) -> bool:
    """Whether this torch build has oneDNN and the fused linear op, and the op computes x @ W^T + b in `dtype`
    (probed once per dtype on a small exact product: the op is private, so a torch release that changed it,
    or a processor it does not support, makes linear() keep F.linear instead of failing).

    When it does, the op's FLOPs are registered with torch's FlopCounterMode, which knows aten.mm but not
    this op: without it, a FLOP count of a product routed to oneDNN would read 0.
    """
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    op = torch.ops.mkldnn._linear_pointwise
    # Outside the caller's dispatch modes: the first product may run inside a FlopCounterMode (or a fake-tensor mode),
    # which must not see the probe.
    with torch.inference_mode(), _disable_current_modes():
        x = torch.arange(6, dtype=dtype).view(2, 3)  # small integers: every path is exact, bfloat16 included
        w, b = torch.arange(12, dtype=dtype).view(4, 3), torch.arange(4, dtype=dtype)
        try:
            ok = torch.equal(op(x, w, b, "none", [], ""), F.linear(x, w, b))
        except RuntimeError:
            ok = False
    if ok and op not in flop_counter.flop_registry:  # keyed by the overload packet
        flop_counter.register_flop_formula(op)(_linear_flops)
    return ok


def _linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """x [tokens, in] @ w[out, in]^T: 2 * tokens * out * in."""
    return 2 * x_shape[0] * w_shape[0] * x_shape[1]


def _onednn(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2.contiguous(), weight, bias, "none", [], "")


def _upcast_blocks(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """bfloat16 storage, float32 compute: a float32 copy of the whole weight would be written to memory and read
    back; one block of rows at a time stays in cache. Each block's float32 result is rounded once."""
    x32 = x2.float()  # [tokens, in]
    out = torch.empty(x2.shape[0], weight.shape[0], dtype=x2.dtype)  # [tokens, out]
    step = max(1, UPCAST_BYTES // (4 * weight.shape[1]))  # weight rows per float32 block
    for s in range(0, weight.shape[0], step):
        b = None if bias is None else bias[s : s + step].float()
        out[:, s : s + step] = F.linear(x32, weight[s : s + step].float(), b)  # rounded once, on assignment
    return out


# Every path is validated by forms_for before it runs, so the kernel is launched without its own checks.
FORMS = {
    "f_linear": F.linear,
    "onednn": _onednn,
    "upcast_blocks": _upcast_blocks,
    "gemv": torch_gemv.launch,
    "gemm": torch_gemm.launch,
    "upcast": torch_gemm.launch_upcast,
}


def forms_for(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[str, ...]:
    """The paths that can compute `linear(x, weight, bias)`, F.linear first. More than one only for CPU tensors
    of one dtype (float32 or bfloat16), a contiguous weight and no gradient to record: oneDNN where this build
    runs it for the dtype, upcast_blocks for bfloat16, the CPU kernels where they were built: gemv for at most its
    MAX_ROWS token rows (kernels/cpu/torch_gemv.py), gemm and upcast for a bfloat16 product of more
    (kernels/cpu/torch_gemm.py)."""
    dtype = x.dtype  # plain comparisons, cheapest first: a decode step asks ~170 times
    if not (
        (dtype is torch.float32 or dtype is torch.bfloat16)
        and weight.dtype is dtype
        and x.is_cpu
        and weight.is_cpu
        and (bias is None or (bias.dtype is dtype and bias.is_cpu))
        and weight.is_contiguous()
        and not (
            torch.is_grad_enabled()
            and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
        )
    ):
        return ("f_linear",)
    onednn = ("onednn",) if _onednn_available(x.dtype) else ()
    blocks = ("upcast_blocks",) if x.dtype == torch.bfloat16 else ()
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # [tokens, in]
    if torch_gemv.supports(x2, weight, bias):
        kernels = ("gemv",)
    else:
        gemm = ("gemm",) if torch_gemm.supports(x2, weight, bias) else ()
        kernels = (*gemm, "upcast") if torch_gemm.supports_upcast(x2, weight, bias) else gemm
    return ("f_linear", *onednn, *blocks, *kernels)


def has_choice(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """True when more than one path can compute `linear(x, weight, bias)` (forms_for names them)."""
    return len(forms_for(x, weight, bias)) > 1


@functools.cache
def _arena(dtype: torch.dtype) -> torch.Tensor:
    """STREAM_BYTES of ones, written once per process: the distinct weights of a timing pass are views of it."""
    return torch.ones(STREAM_BYTES // dtype.itemsize, dtype=dtype)


def resident_weights(weights: Iterable[torch.Tensor]) -> contextlib.AbstractContextManager[None]:
    """Within the block (this thread), a few-row product's measurement times over `weights` (a model's parameters:
    torch_impl/generate.py passes them) where they hold enough of its shape, instead of the arena, whose pages are
    mapped when it is first asked for (docs/benchmarks.md: that cost ~0.3 s beside the benchmark's other backends)."""
    return PATHS.timing_weights(weights, _resident_key)


def _resident_key(weight: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype, bool]:
    return tuple(weight.shape), weight.dtype, weight.is_cpu and weight.is_contiguous()


def _candidates(
    paths: tuple[str, ...], x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> dict[str, Timed]:
    """One timing pass per path (see the docstring). A weight larger than STREAM_BYTES: its first STREAM_BYTES of
    output rows (a view). Else few rows: the product over distinct weights of this shape that together stream
    STREAM_BYTES; many rows: the product with the weight it was called with. The passes that stream evict their
    weights from the caches first (untimed)."""
    row_bytes = weight.shape[1] * weight.element_size()
    if weight.shape[0] * row_bytes >= STREAM_BYTES:
        out = max(1, STREAM_BYTES // row_bytes)
        weights, b = [weight[:out]], None if bias is None else bias[:out]
    elif x2.shape[0] > STREAM_ROWS:
        weights, b = [weight], bias
    else:
        copies = max(1, min(MAX_COPIES, STREAM_BYTES // (weight.shape[0] * row_bytes)))
        own = PATHS.resident(_resident_key(weight))  # a model's weights of this shape, if offered
        if len(own) >= copies:
            weights, b = own[:copies], bias  # in memory already: the very weights its products stream
        else:
            arena = _arena(weight.dtype)[: copies * weight.numel()]
            weights, b = arena.view(copies, *weight.shape).unbind(0), bias
    x2 = x2.contiguous()
    # A pass that streams (few rows, or a table's first rows) reads its weights from memory, as a decode step finds
    # them (spec/path_choice.py's Pass); a prefill-sized product is compute-bound, timed as its weight stands.
    streams = weight.shape[0] * row_bytes >= STREAM_BYTES or x2.shape[0] <= STREAM_ROWS
    evict = evicting((w.data_ptr(), w.numel() * w.element_size()) for w in weights) if streams else None

    def run(form: Callable) -> None:
        for w in weights:
            form(x2, w, b)

    passes = {path: functools.partial(run, FORMS[path]) for path in paths}
    return passes if evict is None else {path: Pass(run, evict) for path, run in passes.items()}


def rows_key(rows: int) -> int:
    """The row count a choice is kept under: exact up to STREAM_ROWS (a few rows stream the weight, and each
    count streams it differently), else the power of two at or above it. A compute-bound product's faster
    library does not turn within a factor of two of rows, and a mixture-of-experts prefill calls one product per
    distinct expert row count: measured exactly, that was ~100 choices for one prompt."""
    return rows if rows <= STREAM_ROWS else 1 << (rows - 1).bit_length()


def path_of(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> str:
    """The path `linear(x, weight, bias)` takes: forced, chosen before for its key, or measured now."""
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # [tokens, in]
    paths = forms_for(x2, weight, bias)
    if len(paths) == 1:
        return "f_linear"
    forced = PATHS.forced_path()
    if forced is not None:
        return forced if forced in paths else "f_linear"
    if weight.numel() * weight.element_size() < MIN_CHOICE_BYTES:
        return "f_linear"  # a weight that stays in cache: nothing to stream, nothing worth measuring
    dtype = str(x.dtype).removeprefix("torch.")
    key = (rows_key(x2.shape[0]), weight.shape[1], weight.shape[0], dtype, bias is not None)
    rule = COMPUTE_BOUND if x2.shape[0] > STREAM_ROWS else {}  # a prompt's product: the median of three rounds
    return PATHS.choose(key, lambda: _candidates(paths, x2, weight, bias), **rule)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, path: str | None = None
) -> torch.Tensor:
    """x [..., in] @ weight[out, in]^T (+ bias) -> [..., out], computed as one [tokens, in] product.

    `path` (one of PATHS.paths: "f_linear", "onednn", "upcast_blocks", "gemv", "gemm", "upcast") pins the path where
    it applies (else F.linear); None takes the measured choice.
    """
    x2 = x.reshape(-1, x.shape[-1])  # [tokens, in]
    if path is None:
        path = path_of(x2, weight, bias)
    elif PATHS.check(path) not in forms_for(x2, weight, bias):
        path = "f_linear"  # autograd, another device or dtype, no oneDNN: F.linear applies
    out = FORMS[path](x2, weight, bias)  # [tokens, out]
    return out.view(*x.shape[:-1], out.shape[-1])  # [..., out]


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
