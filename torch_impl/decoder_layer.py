"""One decoder layer in the dual-variable residual flow (docs/design.md, "The dual-variable flow"): pre-norm
(Llama, Qwen, Mistral, sequential GPT-NeoX, the mixture-of-experts families, whose sparse layers hold a
SparseMoeBlock from torch_impl/moe.py in place of the MLP) or sandwich (Gemma 2/3: pre and post norms);
`decoder_layer` picks the spec's layer class, the plain-flow ones (post-norm OLMo 2, parallel GPT-NeoX) in
decoder_layer_plain.py.

Mirrors jax_impl/decoder_layer.py. A layer takes and returns (hidden, residual): the add of the
previous increment into the residual stream happens inside the next add_rms_norm, so the returned
hidden is the MLP's increment, not x2. Trace mode records the math variables x1 and x2 explicitly.

Sandwich: the post norms are plain norms of an increment (HF's names: `post_attention_layernorm` is the norm ON
the attention output), and the pre-norms fuse with the residual add: x1 = x + post_attn_norm(attn), then
pre_feedforward_layernorm(x1) is one add_rms_norm of the normed increment into the residual.

A CPU decode step of a dense pre-norm layer with a SwiGLU MLP and full attention (Llama, Qwen2, Qwen3, Mistral's
full layers) runs as one C call (kernels/cpu/torch_decode_layer.py) where each of its products took the few-row
kernel: the same functions as the per-operator calls in the same order, so the same result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from kernels.cpu import decode_layer_operands, torch_decode_layer, torch_decode_ops
from spec import ModelSpec
from spec.kv_cache import full_error
from torch_impl import layer_choice, linear
from torch_impl.attention import Attention
from torch_impl.decoder_layer_plain import ParallelDecoderLayer, PostNormDecoderLayer
from torch_impl.layernorm import make_norm
from torch_impl.mlp import MLP
from torch_impl.moe import SparseMoeBlock

if TYPE_CHECKING:
    from torch_impl.kv_cache import KVCache


class DecoderLayer(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        layer_idx: int,
        *,
        kernels: str = "reference",
        tp: int = 1,
        group: dist.ProcessGroup | None = None,
        experts: range | None = None,
        ep_group: dist.ProcessGroup | None = None,
    ):
        """A sparse layer (`spec.is_sparse`) holds a SparseMoeBlock: `experts` are its rank's global expert
        indices (None: all), `ep_group` the expert-parallel group (torch_impl/expert_parallel.py)."""
        super().__init__()
        self.layer_idx = layer_idx
        self.sparse = spec.is_sparse(layer_idx)
        self.sandwich = spec.norm_placement == "sandwich"
        h = spec.hidden_size
        self.input_layernorm = make_norm(spec, h, kernels=kernels)
        self.self_attn = Attention(spec, layer_idx, kernels=kernels, tp=tp, group=group)
        self.post_attention_layernorm = make_norm(spec, h, kernels=kernels)
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(spec, h, kernels=kernels)
        if self.sparse:
            moe = dict(kernels=kernels, tp=tp, group=group, experts=experts, ep_group=ep_group)
            self.mlp = SparseMoeBlock(spec, layer_idx, **moe)
        else:
            self.mlp = MLP(spec, layer_idx, kernels=kernels, tp=tp, group=group)
        if self.sandwich:
            self.post_feedforward_layernorm = make_norm(spec, h, kernels=kernels)
        # the layers decode_layer.c computes; the rest of the rule is asked per step
        self.one_call = decode_layer_operands.computes(spec, layer_idx) and kernels == "reference" and tp == 1
        # (rows, dtype): ((linear.PATHS.version, LAYERS.version), whether the step runs in one call)
        self._choice_known: dict[tuple[int, torch.dtype], tuple[tuple[int, int], bool]] = {}
        self._one_call_prepared: torch_decode_layer.LayerCall | None = None  # the last step's, kept while it stands

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
        trace: dict[str, torch.Tensor] | None = None,
        routing: dict[int, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`routing`: teacher-forced expert ids per sparse layer (CausalLM.forward checks them); a sparse layer
        uses its own entry, if any."""
        if self.one_call and cache is not None and trace is None:
            walked = self._walk()  # asked once: the rule's hooks and the call's weights
            if self._takes_one_call(hidden, residual, cos, sin, mask, cache, walked):
                return self._decode_in_one_call(hidden, residual, cos, sin, mask, cache, walked[1])
        if residual is None:  # layer 0: the residual stream starts as the embedding h0
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:  # residual := previous increment + residual (= the previous layer's x2)
            hidden, residual = self.input_layernorm(hidden, residual)
        name = f"layers.{self.layer_idx}"
        if trace is not None:
            trace[f"{name}.input_norm"] = hidden
        hidden = self.self_attn(hidden, cos, sin, mask, cache, trace)
        if trace is not None:
            trace[f"{name}.attn_out"] = hidden
        if self.sandwich:
            hidden = self.post_attention_layernorm(hidden)  # the normed increment
            if trace is not None:
                trace[f"{name}.attn_post_norm"] = hidden
            hidden, residual = self.pre_feedforward_layernorm(hidden, residual)  # residual is now x1
        else:
            hidden, residual = self.post_attention_layernorm(hidden, residual)  # residual is now x1
        if trace is not None:
            trace[f"{name}.x1"] = residual
            trace[f"{name}.post_attn_norm"] = hidden
        if self.sparse:
            hidden = self.mlp(hidden, trace, None if routing is None else routing.get(self.layer_idx))
        else:
            hidden = self.mlp(hidden, trace)  # an increment: x2 = hidden + residual, materialized later
        if trace is not None:
            trace[f"{name}.mlp_out"] = hidden
        if self.sandwich:
            hidden = self.post_feedforward_layernorm(hidden)
            if trace is not None:
                trace[f"{name}.mlp_post_norm"] = hidden
        if trace is not None:
            trace[f"{name}.x2"] = (hidden.float() + residual.float()).to(hidden.dtype)
        return hidden, residual

    def _takes_one_call(self, hidden: torch.Tensor, residual: torch.Tensor | None, cos, sin, mask, cache: KVCache,
                        walked: tuple) -> bool:  # fmt: skip
        """Whether this step runs in one call: the step's rules (`_step_takes`, given this layer's `_walk()`), and the
        layer's choice (torch_impl/layer_choice.py: the kernel applies to all six products, and the call was measured
        faster or is pinned), asked once per row count and dtype, again after either choice is cleared; a forced path
        is asked every time."""
        if not self._step_takes(hidden, residual, cache, walked):
            return False
        known = self._known_choice(hidden)
        if known is not None:
            return known
        ok = layer_choice.charged_choice(self, hidden, residual, cos, sin, mask, cache)
        if not _pinned():
            versions = (linear.PATHS.version, layer_choice.LAYERS.version)
            self._choice_known[(hidden.shape[0], hidden.dtype)] = (versions, ok)
        return ok

    def _step_takes(self, hidden: torch.Tensor, residual: torch.Tensor | None, cache: KVCache, walked: tuple) -> bool:
        """Given this layer's `_walk()`: no forward hook waiting on a module whose forward the one call would skip (a
        global one, or one on a module the call stands in for: the norms, the attention and the MLP, their products
        and q/k norms), a decode step's rows (torch_decode_ops.takes_step, with the input norm's weight), the cache in
        the activations' dtype."""
        hooked, weights = walked
        return (
            not (hooked or _global_forward_hooks or _global_forward_pre_hooks)
            and torch_decode_ops.takes_step(hidden, weights[0], residual)
            and cache.k[self.layer_idx].dtype is hidden.dtype
            and torch_decode_layer.enabled()
        )

    def _known_choice(self, hidden: torch.Tensor) -> bool | None:
        """The layer's choice for this step's rows and dtype where it was made since the choices were last cleared
        and neither is forced; else None."""
        if _pinned():
            return None
        known = self._choice_known.get((hidden.shape[0], hidden.dtype))
        versions = (linear.PATHS.version, layer_choice.LAYERS.version)
        return known[1] if known is not None and known[0] == versions else None

    def prepared_step(self, hidden: torch.Tensor, cache: KVCache) -> torch_decode_layer.LayerCall | None:
        """This layer's decode step of `hidden` as the LayerCall an earlier step laid out, where the rule takes the
        step and that call still stands for the layer's weights and cache; None otherwise (the layer's own forward
        then runs it). Model runs a stack of such calls at once (torch_decode_stack.LayerStack), which would skip this
        layer's own nn.Module call too: a layer with a forward hook of its own runs its forward."""
        call = self._one_call_prepared
        if call is None or not call.laid_out or cache.length >= cache.max_len:  # a full cache: forward refuses it
            return None
        if self._forward_hooks or self._forward_pre_hooks or not self.one_call:
            return None
        walked = self._walk()  # the modules and weights in one pass: asked of every layer at every step
        if not self._step_takes(hidden, None, cache, walked):
            return None
        known = self._known_choice(hidden)
        if known is None and _pinned():  # a pinned choice measures nothing: asked here
            known = layer_choice.takes_one_call(self, hidden, None, None, None, None, cache)
        if not known:  # not taken, or not chosen yet: the layer's forward asks (and measures)
            return None
        i = self.layer_idx
        return call if call.stands_for(walked[1], cache.k[i], cache.v[i]) else None

    def _one_call_weights(self) -> torch_decode_layer.LayerWeights:
        return torch_decode_layer.LayerWeights(*self._walk()[1])

    def _walk(self) -> tuple[bool, tuple[torch.Tensor | None, ...]]:
        """(whether a forward hook waits on a module the call stands in for, the call's weights in LayerWeights'
        field order), each module on the weights' paths visited once, read through the modules' own tables
        (`_child`): a decode step asks this of every layer."""
        nodes, hooked = [self], False
        for parent, name in _MODULE_STEPS:
            module = _child(nodes[parent], name)
            hooked = hooked or (module is not None and bool(module._forward_hooks or module._forward_pre_hooks))
            nodes.append(module)
        return hooked, tuple(_child(nodes[at], name) for at, name in _WEIGHT_STEPS)

    def _decode_in_one_call(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, cos, sin, mask, cache: KVCache,
        weights: tuple[torch.Tensor | None, ...],
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """This layer's decode step as torch_decode_layer.decode_layer (`weights`: the walk's): the new keys and
        values written at the cache's next slot, as cache.update writes them."""
        if cache.length >= cache.max_len:
            raise full_error(cache.length + 1, cache.max_len)
        i = self.layer_idx
        call = self._one_call_prepared
        if call is None or not call.stands_for(weights, cache.k[i], cache.v[i]):  # a new cache, or new weights
            attn, norm = self.self_attn, self.input_layernorm
            call = self._one_call_prepared = torch_decode_layer.LayerCall(
                torch_decode_layer.LayerWeights(*weights), cache.k[i], cache.v[i], heads=attn.num_heads,
                eps=norm.eps, scale=attn.scale, softcap=attn.softcap, **norm.options,
            )  # fmt: skip
        out = call(hidden, residual, cos, sin, cache.length, mask)
        if call.copied:  # it read a contiguous copy of a weight: the next step lays out anew
            self._one_call_prepared = None
        return out


def _pinned() -> bool:
    """Whether the products' path or the layer's is forced in this thread (asked anew at every step)."""
    return linear.PATHS.forced_path() is not None or layer_choice.LAYERS.forced_path() is not None


# decode_layer.c's weights (LayerWeights' fields) as this layer's attribute paths
_ONE_CALL_WEIGHTS = {
    "input_norm": ("input_layernorm", "weight"), "post_norm": ("post_attention_layernorm", "weight"),
    "q_norm": ("self_attn", "q_norm", "weight"), "k_norm": ("self_attn", "k_norm", "weight"),
    **{f"w{p}": ("self_attn", f"{p}_proj", "weight") for p in "qkvo"},
    "wgu": ("mlp", "gate_up_proj", "weight"), "wd": ("mlp", "down_proj", "weight"),
    **{f"b{p}": ("self_attn", f"{p}_proj", "bias") for p in "qkvo"},
    "bgu": ("mlp", "gate_up_proj", "bias"), "bd": ("mlp", "down_proj", "bias"),
}  # fmt: skip


# the modules a one-call step stands in for, as attribute paths: those on the way to its weights (a parent before its
# children); and the walk over them (DecoderLayer._walk): each module as (its parent's place among [the layer,
# *_ONE_CALL_MODULES], its name), each weight as (its module's place, its name)
_ONE_CALL_MODULES = tuple(sorted({path[:i] for path in _ONE_CALL_WEIGHTS.values() for i in range(1, len(path))}))
_MODULE_STEPS = tuple(
    (_ONE_CALL_MODULES.index(path[:-1]) + 1 if path[:-1] else 0, path[-1]) for path in _ONE_CALL_MODULES
)
_WEIGHT_STEPS = tuple((_ONE_CALL_MODULES.index(path[:-1]) + 1, path[-1]) for path in _ONE_CALL_WEIGHTS.values())


def _child(module: nn.Module | None, name: str) -> nn.Module | torch.Tensor | None:
    """module's attribute `name` (None where module is None: no q/k norm), read from the modules' own tables where
    the name is registered there, as nn.Module.__getattr__ would find it without its Python call (1.7 us a
    three-name path against 0.1)."""
    if module is None:
        return None
    modules, parameters = module._modules, module._parameters
    return modules[name] if name in modules else parameters[name] if name in parameters else getattr(module, name)


def decoder_layer(
    spec: ModelSpec,
    layer_idx: int,
    *,
    kernels: str = "reference",
    tp: int = 1,
    group: dist.ProcessGroup | None = None,
    experts: range | None = None,
    ep_group: dist.ProcessGroup | None = None,
) -> DecoderLayer | PostNormDecoderLayer | ParallelDecoderLayer:
    """The layer class of the spec's residual flow, built for layer `layer_idx` (mixture-of-experts exists for
    the pre-norm flow only: the spec refuses the others, so only DecoderLayer takes `experts`, `ep_group`)."""
    if spec.norm_placement == "post":
        cls = PostNormDecoderLayer
    elif spec.parallel_residual:
        cls = ParallelDecoderLayer
    else:
        return DecoderLayer(spec, layer_idx, kernels=kernels, tp=tp, group=group, experts=experts, ep_group=ep_group)
    return cls(spec, layer_idx, kernels=kernels, tp=tp, group=group)
