"""Registering a CPU kernel's launcher as a torch operator (`torch.ops.decoder_parity.<name>`), for the launchers
that call their kernels through ctypes (torch_gemv.py, torch_gemm.py): while a dispatch mode (FlopCounterMode) or the
profiler is active they call the operator, so those see the product like any other, its FLOPs counted as aten.mm's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils import flop_counter

_LIBRARIES: list[torch.library.Library] = []  # a Library unregisters its operators when collected


def product_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """x [rows, in] @ w[out, in]^T: 2 * rows * out * in, as FlopCounterMode counts aten.mm."""
    return 2 * x_shape[0] * w_shape[0] * x_shape[1]


def define(name: str, schema: str, impl: Callable, flops: Callable = product_flops):
    """torch.ops.decoder_parity.<name>, its `schema` ("name(Tensor x, ...) -> Tensor") implemented on the CPU by
    `impl` (no autograd formula), its FLOPs counted by `flops`. Once per process per name (the launchers cache it)."""
    library = torch.library.Library("decoder_parity", "FRAGMENT")
    library.define(schema)
    library.impl(name, impl, "CPU")
    _LIBRARIES.append(library)
    op = getattr(torch.ops.decoder_parity, name)
    flop_counter.register_flop_formula(op)(flops)
    return op
