"""`linear(x, weight, bias)` and the `Linear` module built on it: one 2-D product whatever x's leading dims.

Mirrors jax_impl/linear.py, where XLA's dot needs neither choice below but the Flax [in, out] kernel needs
its own. Two CPU choices, both measured on the 2-core AMD EPYC machine this project runs CI on (benchmarks/cpu_decode.py
shows the effect end to end):

- 2-D, always: F.linear on a 3-D [B, T, in] input goes through a batched-matmul path; for a decode step
  (T = 1) the same product as a 2-D [tokens, in] GEMV streams the weight about 1.5x faster.
- oneDNN for float32 inference: this torch build sends float32 F.linear to MKL, which on this AMD CPU
  streams a decode-step weight at 13-14 GB/s; oneDNN's matmul (the op torch.compile's CPU backend emits,
  `torch.ops.mkldnn._linear_pointwise`) streams 25-29 GB/s for the same products: 1.6-2.1x faster for a
  decode step and 1.2-1.6x for a 128-token prefill, with float32 accumulation (max error vs a float64
  product 3e-7..9e-7 relative, the same order as MKL's). bfloat16/float16 already go to oneDNN, so they,
  autograd (the op has no backward) and non-CPU tensors keep F.linear.

The parameters are nn.Linear's own (`weight` [out, in], `bias`), so checkpoints load unchanged.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import flop_counter


@functools.cache
def _onednn_available() -> bool:
    """Whether this torch build has oneDNN and the fused linear op, and the op computes x @ W^T + b
    (probed once, on first use, on a small exact product: the op is private, so a torch release that
    changed it makes linear() fall back to F.linear instead of failing).

    When it does, the op's FLOPs are registered with torch's FlopCounterMode, which knows aten.mm but not
    this op: without it, a FLOP count of torch_impl's float32 inference would read 0.
    """
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    op = torch.ops.mkldnn._linear_pointwise
    x = torch.arange(6, dtype=torch.float32).view(2, 3)  # small integers: every path is exact
    w, b = torch.arange(12, dtype=torch.float32).view(4, 3), torch.arange(4, dtype=torch.float32)
    try:
        with torch.inference_mode():
            ok = torch.equal(op(x, w, b, "none", [], ""), F.linear(x, w, b))
    except RuntimeError:
        ok = False
    if not ok:
        return False
    if op not in flop_counter.flop_registry:  # keyed by the overload packet
        flop_counter.register_flop_formula(op)(_linear_flops)
    return True


def _linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """x [tokens, in] @ w[out, in]^T: 2 * tokens * out * in."""
    return 2 * x_shape[0] * w_shape[0] * x_shape[1]


def uses_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when `linear(x, weight)` takes the oneDNN path: float32 CPU tensors, no gradient to record."""
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return (
        x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and not needs_grad
        and weight.is_contiguous()
        and _onednn_available()
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ weight[out, in]^T (+ bias) -> [..., out], computed as one [tokens, in] product."""
    x2 = x.reshape(-1, x.shape[-1])  # [tokens, in]
    if uses_onednn(x2, weight):
        out = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), weight, bias, "none", [], "")  # [tokens, out]
    else:
        out = F.linear(x2, weight, bias)  # [tokens, out]
    return out.view(*x.shape[:-1], out.shape[-1])  # [..., out]


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
