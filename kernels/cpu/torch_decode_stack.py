"""PyTorch launcher of a decode step's consecutive decoder layers in one call (decode_layer.c's decode_layers_NAME):
`LayerStack`, over the per-layer calls kernels/cpu/torch_decode_layer.py prepares.

torch_impl/model.py's Model runs its layers' decode step through a LayerStack once every layer holds a LayerCall laid
out at an earlier step: the step then crosses from Python into C once, not once a layer. The stack copies each call's
struct and checks only layer 0's operands; what each layer computes, and every check of its steady operands, is
torch_decode_layer.py's. jax_impl has no twin: XLA's program already runs its layers' calls without Python between
them.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.cpu import build
from kernels.cpu.torch_decode_layer import LayerCall, LayerStruct, refuse, set_step


@functools.cache
def _stack_functions() -> dict[torch.dtype, ctypes._CFuncPtr] | None:
    argtypes = [ctypes.POINTER(LayerStruct), ctypes.c_long]
    names = {torch.float32: ("decode_layers_f32", argtypes), torch.bfloat16: ("decode_layers_bf16", argtypes)}
    return build.functions("decode_layer", names)


class LayerStack:
    """Consecutive layers' decode steps in one call (decode_layer.c's decode_layers_NAME): each layer's LayerCall laid
    out at an earlier step, each layer on the previous one's outputs, the step's operands checked once (for layer 0,
    against the shapes every call's first step fixed: the same for all, or no stack). A step then crosses from Python
    into C once, not once a layer; the results are the calls' one by one, bit for bit."""

    def __init__(self, calls: list[LayerCall]):
        if not calls or not all(c.laid_out and c.step_shapes == calls[0].step_shapes for c in calls):
            raise refuse("a stack takes laid-out calls (a step ran through each) of one dtype, rows and rotary width")
        self.calls = tuple(calls)
        self._layers = (LayerStruct * len(calls))(*(c.struct for c in calls))  # copies: each step sets its own
        self._function = _stack_functions()[calls[0].step_shapes[0]]

    def __deepcopy__(self, memo) -> None:
        return None  # as LayerCall's: a copied or pickled model makes its own stack

    def __reduce__(self):
        return type(None), ()

    def holds(self, calls: list[LayerCall]) -> bool:
        return len(calls) == len(self.calls) and all(a is b for a, b in zip(calls, self.calls, strict=True))

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: int, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, 1, H]: layer 0's input (the embedding, no residual yet) -> the last layer's (MLP increment, residual);
        every layer's keys and values written at slot `pos`."""
        if not all(call.alive for call in self.calls):
            raise refuse("a layer's weights or cache were freed since the stack was made: make it anew")
        self.calls[0].check_step(x, None, cos, sin, pos, mask)
        x, cos, sin, mask = x.contiguous(), cos.contiguous(), sin.contiguous(), mask.contiguous()
        pairs = [(torch.empty_like(x), torch.empty_like(x)) for _ in range(min(2, len(self.calls)))]
        set_step(self._layers[0], x, None, cos, sin, pos, mask)
        biases = []  # bound until the call
        for i, (layer, call) in enumerate(zip(self._layers, self.calls, strict=True)):
            out, residual_out = pairs[i % 2]  # layer i + 1 reads layer i's pair and writes the other
            layer.out, layer.residual_out = out.data_ptr(), residual_out.data_ptr()
            biases += call.widen_biases(layer)
        self._function(self._layers, len(self.calls))
        return pairs[(len(self.calls) - 1) % 2]
