"""torch_impl's decoder one piece at a time, straight from a checkpoint: for a layer-streamed parity check.

Mirrors jax_impl/layerwise.py. `Layerwise` builds each piece from the classes the whole model is made of
(`Embedding`, `DecoderLayer`, `RMSNorm`, `Linear`) on the meta device, fills it from spec/layerwise.py
(`runtime_params` restricted to the piece: validated, packed, scanned) as torch_impl/loader.py fills the
whole model, runs it and drops it before the next piece loads:

    embed(ids)             the embedding: a gather from the rows the ids read (rows[inverse] == E[ids])
    run_layer(i, inputs)   decoder layer i, loaded once, run on each input (free-running, teacher-forced)
    head(inputs)           the final norm, then the logits over the head's table in blocks of rows

Between pieces only the activations at a layer boundary are kept: a `Boundary`, the (hidden, residual) pair
of the dual-variable flow (docs/design.md, "The dual-variable flow"); x2 of a layer is hidden + residual.
Each piece records the same trace names as `CausalLM.forward` (parity/components.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from kernels import resolve_kernels
from spec import InputError, ModelSpec, check_token_ids, dtype_name
from spec.layerwise import embedding_rows, final_norm_module, head_blocks, layer_params, module_param
from spec.params import EMBEDDING, NORM
from torch_impl.decoder_layer import DecoderLayer
from torch_impl.embedding import Embedding
from torch_impl.layernorm import RMSNorm
from torch_impl.linear import Linear
from torch_impl.loader import DTYPES, to_torch
from torch_impl.model import causal_mask, default_positions
from torch_impl.rotary_embedding import RotaryEmbedding

Boundary = tuple[torch.Tensor, torch.Tensor | None]  # (hidden, residual); residual None before layer 0
Trace = dict[str, torch.Tensor] | None


class Layerwise:
    """One checkpoint, one dtype: its pieces built and run on demand; `load_s` and `run_s` add up the time."""

    def __init__(
        self, path: str | Path, dtype: torch.dtype | str = "float32", *, kernels: str = "reference", device="cpu"
    ):
        self.directory = Path(path)
        self.spec = ModelSpec.from_pretrained(path)
        self.dtype = DTYPES[dtype_name(dtype)] if isinstance(dtype, str) else dtype
        self.device = torch.device(device)
        self.kernels = resolve_kernels(kernels, on_gpu=torch.cuda.is_available())
        self.rotary = RotaryEmbedding(self.spec).to(self.device)  # inv_freq from the spec, as the loader sets it
        self._rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # cos, sin, mask of the batch
        self.load_s = self.run_s = 0.0

    def _build(self, make: Callable[[], nn.Module], params: Iterable[tuple[str, str, str, np.ndarray]]) -> nn.Module:
        """`make()` on the meta device, allocated in this dtype and filled from `params` (module path inside the
        piece, role, kind, array), as torch_impl/loader.py fills the whole model. Every parameter must be filled."""
        start = time.perf_counter()
        with torch.device("meta"):
            module = make()
        module = module.to(self.dtype).to_empty(device=self.device)  # storage allocated, not initialized
        modules = dict(module.named_modules())
        filled = set()
        with torch.no_grad():
            for path, role, _kind, array in params:
                param: nn.Parameter = getattr(modules[path], role)
                tensor = to_torch(array)
                if tuple(tensor.shape) != tuple(param.shape):
                    raise AssertionError(f"{path}.{role}: packed shape {list(tensor.shape)} != {list(param.shape)}")
                param.copy_(tensor)
                filled.add(f"{path}.{role}".lstrip("."))
        unfilled = {name for name, _ in module.named_parameters()} - filled
        if unfilled:
            raise AssertionError(f"parameters the checkpoint did not fill: {sorted(unfilled)}")
        self.load_s += time.perf_counter() - start
        return module.eval().requires_grad_(False)

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """Time a run (added to `run_s`), under inference mode as parity/capture.py runs the whole model."""
        start = time.perf_counter()
        with torch.inference_mode():
            yield
        self.run_s += time.perf_counter() - start

    def embed(self, ids: np.ndarray, trace: Trace = None) -> Boundary:
        """The embedding of `ids` [B, T] (checked against the vocabulary first); also fixes the batch's RoPE
        angles and causal mask, which every layer reuses, built as `CausalLM.forward` builds them."""
        ids = check_token_ids(ids, self.spec)
        rows, inverse = embedding_rows(self.directory, self.spec, ids)  # rows [U, H], inverse [B, T]
        table = self._build(lambda: Embedding(rows.shape[0], self.spec.hidden_size), [("", "weight", EMBEDDING, rows)])
        b, t = ids.shape

        with self._running():
            key_valid = torch.ones(b, t, dtype=torch.bool, device=self.device)
            cos, sin = self.rotary(default_positions(key_valid, 0, t))
            self._rope = (cos, sin, causal_mask(key_valid, 0, t))
            hidden = table(torch.as_tensor(inverse, device=self.device))  # [B, T, H]
        if trace is not None:
            trace["embed"] = hidden
        return hidden, None

    def boundary(self, x: np.ndarray, *, first_layer: bool) -> Boundary:
        """Another run's x at a layer boundary (float32 numpy of values in this dtype, so the cast is exact) as
        this backend's layer input: (x, None) before layer 0 (x is the embedding); else (0, x), whose
        add_rms_norm gives exactly x as the new residual, so the layer normalizes exactly x."""
        tensor = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device, self.dtype)
        return (tensor, None) if first_layer else (torch.zeros_like(tensor), tensor)

    def run_layer(self, index: int, inputs: Sequence[Boundary], traces: Sequence[Trace]) -> list[Boundary]:
        """Load decoder layer `index`, run it on each input (recording into the matching trace), drop it."""
        if self._rope is None:
            raise InputError("run_layer before embed: the batch's positions and mask come from embed(ids)")
        layer = self._build(
            lambda: DecoderLayer(self.spec, index, kernels=self.kernels), layer_params(self.directory, self.spec, index)
        )
        cos, sin, mask = self._rope
        with self._running():
            return [layer(h, r, cos, sin, mask, None, trace) for (h, r), trace in zip(inputs, traces, strict=True)]

    def head(self, inputs: Sequence[Boundary], traces: Sequence[Trace]) -> list[torch.Tensor]:
        """The final norm of each input (consuming the last increment), then its logits [B, T, V], the head's
        table read in blocks of rows (spec/layerwise.py); returns the logits."""
        norm_weight = module_param(self.directory, self.spec, final_norm_module(self.spec))
        norm = self._build(
            lambda: RMSNorm(self.spec.hidden_size, self.spec.rms_norm_eps, kernels=self.kernels),
            [("", "weight", NORM, norm_weight)],
        )
        with self._running():
            normed = [norm(h) if r is None else norm(h, r)[0] for h, r in inputs]  # [B, T, H] each
        del norm
        blocks: list[list[torch.Tensor]] = [[] for _ in inputs]
        for _start, kind, block in head_blocks(self.directory, self.spec):
            rows = block.shape[0]  # a block of the [V, H] table: the Linear weight [out, in] of `rows` logits
            head = self._build(
                lambda n=rows: Linear(self.spec.hidden_size, n, bias=False), [("", "weight", kind, block)]
            )
            with self._running():
                for out, x in zip(blocks, normed, strict=True):
                    out.append(head(x))  # [B, T, rows]
            del head, block  # before the next block loads
        logits = [torch.cat(out, dim=-1) for out in blocks]  # [B, T, V]
        for trace, final, full in zip(traces, normed, logits, strict=True):
            if trace is not None:
                trace["final_norm"] = final
                trace["logits"] = full
        return logits
