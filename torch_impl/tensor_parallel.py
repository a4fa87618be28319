"""Tensor parallelism for the PyTorch decoder on `torch.distributed` (gloo on CPU, nccl on GPU).

The JAX twin is jax_impl/sharding.py. Each rank holds an ordinary `CausalLM` built from a *shard spec*
(the spec with heads, kv heads, intermediate size and padded vocabulary divided by the degree), so
attention, the MLP and the KV cache run unchanged on local shapes; only four modules differ:

    q/k/v, gate_up   column-parallel: plain Linears holding this rank's output rows (no communication)
    o_proj, down     row-parallel (`RowParallelLinear`): this rank's input columns, then all-reduce (sum)
    embed_tokens     vocabulary-parallel (vocab_parallel.py): out-of-shard ids give zeros, all-reduce
    lm_head          this rank's vocabulary rows; tied: the embedding shard's own Parameter

Query heads split in contiguous blocks; kv heads too when the degree divides them, and are replicated
when the degree is a multiple of them (rank r holds kv head r * n_kv // tp, the one its query heads
read). gate_up is packed [gate; up] (spec/params.py): a rank takes the same rows of both halves and
keeps them packed [gate_r; up_r], so the local silu_and_mul split stays right. The vocabulary is
padded with zero rows to a multiple of the degree; the padding is masked to -inf in the logits.

A rank's forward returns its vocabulary shard of the logits, [B, T, padded_vocab / tp]. Greedy decoding
(`generate_tp`) reduces per-shard (max, argmax) across ranks, so no process ever holds full-vocabulary
logits; `gather_logits` is the explicit request that does. Processes are launched by torchrun (each
calls `from_pretrained_tp` and `generate_tp`) or by torch_impl/tp_launch.py's `run_tp`. Inference only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from spec import Checkpoint, ConfigError, ModelSpec, runtime_params
from spec.generation import Generation, SamplingParams, eos_token_ids
from spec.parallel import check_tp_degree, padded_vocab
from spec.params import NORM
from torch_impl.generate import decode_loop, sample
from torch_impl.linear import linear
from torch_impl.loader import DTYPES, to_torch
from torch_impl.model import CausalLM
from torch_impl.vocab_parallel import VocabParallelEmbedding, VocabParallelLMHead, gather_logits, greedy_token

__all__ = [
    "RowParallelLinear",
    "ShardLayout",
    "TensorParallelCausalLM",
    "check_tp_degree",
    "from_pretrained_tp",
    "gather_logits",
    "generate_tp",
    "greedy_token",
    "shard_param",
]


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """What rank `rank` of `tp_size` holds of the full `spec`: index ranges into each split dimension."""

    spec: ModelSpec
    tp_size: int
    rank: int

    def __post_init__(self) -> None:
        check_tp_degree(self.spec, self.tp_size)
        if not 0 <= self.rank < self.tp_size:
            raise ConfigError(f"tensor-parallel rank {self.rank} is outside [0, {self.tp_size})")

    @property
    def heads(self) -> range:
        n = self.spec.num_attention_heads // self.tp_size
        return range(self.rank * n, (self.rank + 1) * n)

    @property
    def kv_heads(self) -> range:
        n_kv = self.spec.num_key_value_heads
        if self.tp_size <= n_kv:
            n = n_kv // self.tp_size
            return range(self.rank * n, (self.rank + 1) * n)
        first = self.rank * n_kv // self.tp_size  # replicated: the kv head that heads[0] reads
        return range(first, first + 1)

    @property
    def intermediate(self) -> range:
        n = self.spec.intermediate_size // self.tp_size
        return range(self.rank * n, (self.rank + 1) * n)

    @property
    def padded_vocab(self) -> int:
        return padded_vocab(self.spec, self.tp_size)  # next multiple of tp_size

    @property
    def vocab_shard(self) -> int:
        return self.padded_vocab // self.tp_size

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_shard

    @property
    def shard_spec(self) -> ModelSpec:
        """The spec of this rank's local modules (GQA still holds: local heads / local kv heads = groups)."""
        return dataclasses.replace(
            self.spec,
            num_attention_heads=len(self.heads),
            num_key_value_heads=len(self.kv_heads),
            intermediate_size=len(self.intermediate),
            vocab_size=self.vocab_shard,
        )


def shard_param(layout: ShardLayout, module: str, role: str, kind: str, array: np.ndarray) -> np.ndarray:
    """This rank's slice of one packed runtime parameter (torch layout [out, in]; biases [out])."""
    if kind == NORM:  # hidden-size and per-head norms are replicated
        return array
    name, d, i = module.rsplit(".", 1)[-1], layout.spec.head_dim, layout.spec.intermediate_size
    if name == "q_proj":  # column-parallel: output rows of this rank's heads (bias likewise)
        return array[layout.heads.start * d : layout.heads.stop * d]
    if name in ("k_proj", "v_proj"):
        return array[layout.kv_heads.start * d : layout.kv_heads.stop * d]
    if name == "o_proj":  # row-parallel: the input columns that this rank's heads produce
        return array[:, layout.heads.start * d : layout.heads.stop * d]
    if name == "gate_up_proj":  # [gate; up], each [I, H] -> [gate_r; up_r], each [I / tp, H]
        rows = slice(layout.intermediate.start, layout.intermediate.stop)
        return np.concatenate([array[:i][rows], array[i:][rows]], axis=0)
    if name == "down_proj":
        return array[:, layout.intermediate.start : layout.intermediate.stop]
    if name in ("embed_tokens", "lm_head"):  # vocabulary rows, zero rows past the real vocabulary
        rows = array[layout.vocab_start : layout.vocab_start + layout.vocab_shard]
        pad = layout.vocab_shard - rows.shape[0]
        return np.concatenate([rows, np.zeros((pad, *rows.shape[1:]), rows.dtype)]) if pad else rows
    raise AssertionError(f"no tensor-parallel rule for {module}.{role}: add one before sharding it")


class RowParallelLinear(nn.Linear):
    """This rank's input columns of a bias-free Linear; the partial products are summed across ranks.

    Low-precision partials are summed in float32 and rounded once, as the unsharded matmul accumulates.
    """

    def __init__(self, in_features: int, out_features: int, group: dist.ProcessGroup | None = None):
        super().__init__(in_features, out_features, bias=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = linear(x, self.weight)  # [..., out], this rank's share of the sum over inputs
        if partial.dtype in (torch.float16, torch.bfloat16):
            total = partial.float()
            dist.all_reduce(total, group=self.group)
            return total.to(partial.dtype)
        dist.all_reduce(partial, group=self.group)
        return partial


class TensorParallelCausalLM(CausalLM):
    """One rank's shard of a `CausalLM`; forward returns this rank's logits [B, T, padded_vocab / tp].

    `spec` is the FULL model's spec, so that `CausalLM.forward` checks ids against the real vocabulary
    and positions against the real limit; `shard_spec` sizes the local modules and the KV cache.
    Every rank must be given the same ids and mask.
    """

    def __init__(
        self,
        spec: ModelSpec,
        layout: ShardLayout,
        *,
        group: dist.ProcessGroup | None = None,
        kernels: str = "reference",
    ):
        super().__init__(layout.shard_spec, kernels=kernels)
        self.spec, self.shard_spec, self.layout, self.group = spec, layout.shard_spec, layout, group
        h, shard = spec.hidden_size, layout.vocab_shard
        self.model.embed_tokens = VocabParallelEmbedding(shard, h, layout.vocab_start, group)
        self.lm_head = VocabParallelLMHead(h, shard, layout.vocab_start, spec.vocab_size)
        for layer in self.model.layers:
            layer.self_attn.o_proj = RowParallelLinear(layer.self_attn.o_proj.in_features, h, group)
            layer.mlp.down_proj = RowParallelLinear(layer.mlp.down_proj.in_features, h, group)
        self.tie_weights()  # the head must be the new embedding shard's Parameter


def from_pretrained_tp(
    path: str | Path,
    dtype: torch.dtype | str = torch.float32,
    *,
    group: dist.ProcessGroup | None = None,
    device: str | torch.device = "cpu",
    kernels: str = "reference",
    progress: bool = False,
) -> TensorParallelCausalLM:
    """Load this rank's shard of the checkpoint at `path`; rank and degree come from `group` (default: world).

    Like torch_impl.from_pretrained: built on the meta device, each packed runtime parameter sliced for
    this rank and copied in, so a rank allocates only its shard.
    """
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    spec = ModelSpec.from_pretrained(path)
    layout = ShardLayout(spec, dist.get_world_size(group), dist.get_rank(group))
    checkpoint = Checkpoint(path)
    with torch.device("meta"):
        model = TensorParallelCausalLM(spec, layout, group=group, kernels=kernels)
    model = model.to(dtype).to_empty(device=device)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for module, role, kind, array in runtime_params(checkpoint, spec, progress=progress and layout.rank == 0):
            param: nn.Parameter = getattr(modules[module], role)
            tensor = to_torch(shard_param(layout, module, role, kind, array))
            if tuple(tensor.shape) != tuple(param.shape):
                raise AssertionError(f"{module}.{role}: shard shape {list(tensor.shape)} != {list(param.shape)}")
            param.copy_(tensor)
        model.model.rotary_emb.inv_freq = torch.from_numpy(spec.inv_freq()).to(device)
    model.eos_token_ids = eos_token_ids(path)
    model.tie_weights()  # to_empty allocated the head separately; point it back at the embedding shard
    return model.eval().requires_grad_(False)


@torch.inference_mode()
def generate_tp(
    model: TensorParallelCausalLM,
    input_ids: np.ndarray | torch.Tensor | Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    attention_mask: np.ndarray | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    stream: Callable[[int, np.ndarray], None] | None = None,
    return_logits: bool = False,
) -> Generation:
    """torch_impl.generate for a tensor-parallel model; every rank calls it with the same arguments.

    Greedy steps use `greedy_token`: only [B] values and ids cross ranks, never [B, V] logits. Sampling
    (temperature > 0) gathers the last position's [B, V] logits and draws with torch_impl's `sample`
    and the same seed, then rank 0's token is broadcast; `return_logits` also gathers them (an explicit
    request). Every rank returns the same Generation.
    """
    params = SamplingParams(temperature, top_k, top_p, seed)
    weight = model.model.embed_tokens.weight
    v, group = model.spec.vocab_size, model.group
    generator = None if params.greedy else torch.Generator(weight.device).manual_seed(params.seed)
    logits_seen: list[np.ndarray] = []

    def pick(local: torch.Tensor) -> torch.Tensor:  # local [B, shard] -> [B], the same on every rank
        if return_logits:
            logits_seen.append(gather_logits(local, v, group).float().cpu().numpy())
        if params.greedy:
            return greedy_token(local, model.layout.vocab_start, group)
        token = sample(gather_logits(local, v, group).float(), params, generator)
        dist.broadcast(token, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        return token

    eos = tuple(model.eos_token_ids if eos_token_ids is None else eos_token_ids)
    gen = decode_loop(model, model.shard_spec, input_ids, max_new_tokens, attention_mask, eos, pick, stream)
    return dataclasses.replace(gen, logits=logits_seen) if return_logits else gen
