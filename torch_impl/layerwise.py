"""torch_impl's decoder one piece at a time, straight from a checkpoint: for a layer-streamed parity check.

Mirrors jax_impl/layerwise.py. `Layerwise` builds each piece from the classes the whole model is made of
(`Embedding`, `DecoderLayer`, `RMSNorm`, `Linear`) on the meta device, fills it from spec/layerwise.py
(`runtime_params` restricted to the piece: validated, packed, scanned) as torch_impl/loader.py fills the
whole model, runs it and drops it before the next piece loads:

    embed(ids)             the embedding: a gather from the rows the ids read (rows[inverse] == E[ids]), scaled
                           where the spec scales it (Gemma)
    run_layer(i, inputs)   decoder layer i, loaded once, run on each input (free-running, teacher-forced)
    head(inputs)           the final norm, then the logits over the head's table in blocks of rows (then the
                           final soft-cap, Gemma 2)

Between pieces only the activations at a layer boundary are kept: a `Boundary`, the (hidden, residual) pair
of the dual-variable flow (docs/design.md, "The dual-variable flow"); x2 of a layer is hidden + residual. In the
plain flow (post-norm OLMo 2, parallel GPT-NeoX) the pair is (x2, None). Each piece records the same trace names
as `CausalLM.forward` (parity/components.py), with the masks and RoPE tables of each layer kind built as it
builds them.
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
from spec import Checkpoint, ModelSpec, check_token_ids, dtype_name, runtime_params
from spec.families import FULL
from spec.layerwise import check_layer_call, embedding_rows, final_norm_module, head_blocks, layer_params
from spec.params import EMBEDDING
from torch_impl.decoder_layer import decoder_layer
from torch_impl.embedding import Embedding
from torch_impl.layernorm import make_norm
from torch_impl.linear import Linear
from torch_impl.loader import DTYPES, to_torch
from torch_impl.model import attention_masks, default_positions, embedding_scale, final_softcap
from torch_impl.moe import check_routing
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
        self.dtype = DTYPES[dtype_name(dtype)]
        self.device = torch.device(device)
        self.kernels = resolve_kernels(kernels, on_gpu=torch.cuda.is_available())
        # inv_freq from the spec, as the loader sets it; one table per RoPE kind (Gemma 3's sliding layers)
        self.rotary = {kind: RotaryEmbedding(self.spec, kind).to(self.device) for kind in self.spec.rope_kinds}
        self._rope: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None  # kind -> cos, sin, mask
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
            positions = default_positions(key_valid, 0, t)
            tables = {kind: rotary(positions) for kind, rotary in self.rotary.items()}
            masks = attention_masks(self.spec, key_valid, 0, t)
            self._rope = {kind: (*tables.get(kind, tables[FULL]), mask) for kind, mask in masks.items()}
            hidden = table(torch.as_tensor(inverse, device=self.device))  # [B, T, H]
            if self.spec.embedding_scale:  # as Model.forward
                hidden = hidden * embedding_scale(self.spec, hidden.dtype)
        if trace is not None:
            trace["embed"] = hidden
        return hidden, None

    def boundary(self, x: np.ndarray, *, first_layer: bool) -> Boundary:
        """Another run's x at a layer boundary (float32 numpy of values in this dtype, so the cast is exact) as
        this backend's layer input: (x, None) before layer 0 (x is the embedding) and in the plain flow (post-norm,
        parallel residual: the stream is carried whole); else (0, x), whose add_rms_norm gives exactly x as the
        new residual, so the layer normalizes exactly x."""
        tensor = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device, self.dtype)
        plain = self.spec.norm_placement == "post" or self.spec.parallel_residual
        return (tensor, None) if first_layer or plain else (torch.zeros_like(tensor), tensor)

    def run_layer(
        self, index: int, inputs: Sequence[Boundary], traces: Sequence[Trace],
        routing: Sequence[np.ndarray | torch.Tensor | None] | None = None,
    ) -> list[Boundary]:  # fmt: skip
        """Load decoder layer `index`, run it on each input (recording into the matching trace), drop it.

        `routing`: per input, this (sparse) layer's teacher-forced expert ids [B, T, k] or None (torch_impl/moe.py;
        checked as CausalLM checks them)."""
        forced = check_layer_call(self._rope is not None, routing, len(inputs))
        layer = self._build(
            lambda: decoder_layer(self.spec, index, kernels=self.kernels),
            layer_params(self.directory, self.spec, index),
        )
        cos, sin, mask = self._rope[self.spec.layer_type(index)]
        outputs = []
        with self._running():
            for (hidden, residual), trace, ids in zip(inputs, traces, forced, strict=True):
                routed = {}  # sparse layers exist in DecoderLayer only: the plain-flow layers take no routing
                if ids is not None:
                    routed["routing"] = check_routing({index: ids}, self.spec, *hidden.shape[:2], self.device)
                outputs.append(layer(hidden, residual, cos, sin, mask, None, trace, **routed))
        return outputs

    def head(self, inputs: Sequence[Boundary], traces: Sequence[Trace]) -> list[torch.Tensor]:
        """The final norm of each input (consuming the last increment), then its logits [B, T, V], the head's
        table read in blocks of rows (spec/layerwise.py), then the final soft-cap where the spec has one; returns
        the logits."""
        final = final_norm_module(self.spec)
        params = runtime_params(Checkpoint(self.directory), self.spec, modules=lambda m: m == final)  # weight, bias
        norm = self._build(
            lambda: make_norm(self.spec, self.spec.hidden_size, kernels=self.kernels),
            ((module[len(final) :], role, kind, array) for module, role, kind, array in params),
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
        heads = [torch.cat(out, dim=-1) for out in blocks]  # [B, T, V]
        cap = self.spec.final_logit_softcapping
        with self._running():
            logits = heads if cap is None else [final_softcap(head, cap) for head in heads]
        for trace, normed_x, head, full in zip(traces, normed, heads, logits, strict=True):
            if trace is not None:
                trace["final_norm"] = normed_x
                if cap is not None:  # as CausalLM.forward: the logits before the cap
                    trace["head"] = head
                trace["logits"] = full
        return logits
