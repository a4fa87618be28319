"""Autoregressive generation with a KV cache: prefill, then one token per step; greedy or sampled.

Mirrors jax_impl/generate.py. The prompt (left-padded when rows differ in length) fills the cache and
yields the first token; each later step feeds one token per row. Rows that reached an EOS id keep
emitting it (ignored afterwards) until every row is done or `max_new_tokens` is reached.

A tensor-parallel model (every rank calls `generate` with the same arguments) picks greedy tokens with
`greedy_token`: only [B] values and ids cross ranks, never [B, V] logits. Sampling gathers the last
position's logits (`gather_logits`), draws with the same seed on every rank, and rank 0's token is
broadcast; `return_logits` gathers them too (an explicit request).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from kernels.cpu import torch_decode_ops
from spec.generation import Generation, Prompts, SamplingParams, check_request, collect_tokens
from torch_impl import linear
from torch_impl.kv_cache import KVCache
from torch_impl.model import CausalLM
from torch_impl.vocab_parallel import gather_logits, greedy_token


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """logits [B, V] float32 -> token ids [B]: argmax, or temperature / top-k / top-p sampling."""
    if params.greedy:
        return logits.argmax(-1)  # ties go to the lowest id
    # Shifted to a row maximum of 0 first: a small temperature then sends the others to -inf, never the maximum to inf.
    logits = (logits - logits.amax(-1, keepdim=True)) / params.temperature
    if params.top_k is not None:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # [B, V]
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > params.top_p  # keep the smallest prefix reaching top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


@torch.inference_mode()
def generate(
    model: CausalLM,
    input_ids: np.ndarray | torch.Tensor | Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    attention_mask: np.ndarray | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_ids: int | Sequence[int] | None = None,
    stream: Callable[[int, np.ndarray], None] | None = None,
    return_logits: bool = False,
) -> Generation:
    """Generate up to `max_new_tokens` per row. `eos_token_ids` None = the checkpoint's; () = never stop; else an
    id or a sequence of ids in [0, V).

    `stream(step, tokens[B])` is called as each token is produced.
    """
    request = check_request(  # any framework's arrays: spec/inputs.py reads them on the host
        model.spec, input_ids, max_new_tokens, attention_mask, eos_token_ids, model.eos_token_ids,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
    )  # fmt: skip
    params = request.params
    device = model.model.embed_tokens.weight.device
    generator = None if params.greedy else torch.Generator(device).manual_seed(params.seed)
    logits_seen: list[np.ndarray] = []

    layout, group = model.layout, model.group

    def pick(last: torch.Tensor) -> torch.Tensor:  # [B, V] (tp > 1: this rank's shard) -> [B]
        sharded = layout.tp > 1
        if return_logits or not (sharded and params.greedy):
            logits = gather_logits(last, model.spec.vocab_size, group).float() if sharded else last.float()
            if return_logits:
                logits_seen.append(logits.cpu().numpy())
        if sharded and params.greedy:
            return greedy_token(last, layout.vocab_start, group)
        token = sample(logits, params, generator)
        if sharded:  # the same seed draws the same token everywhere; rank 0's is made the one
            dist.broadcast(token, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        return token

    with linear.resident_weights(model.parameters()):  # a product's first call may time its paths over them
        gen = decode_loop(model, request.prompts, max_new_tokens, request.eos, pick, stream)
    return dataclasses.replace(gen, logits=logits_seen) if return_logits else gen


def decode_loop(
    model: CausalLM,
    prompts: Prompts,
    max_new_tokens: int,
    eos: tuple[int, ...],
    pick: Callable[[torch.Tensor], torch.Tensor],
    stream: Callable[[int, np.ndarray], None] | None,
) -> Generation:
    """The prefill and decode loop of `generate` (call it under inference_mode). `model(ids, ...)` returns the
    last position's scores [B, 1, V] (or this rank's vocabulary shard) and `pick` turns them into the next
    token ids [B]; the cache is sized by the model's `module_spec` (a rank's holds its local kv heads)."""
    weight = model.model.embed_tokens.weight
    device = weight.device
    batch, prompt_len = prompts.ids.shape
    slots = prompt_len + max_new_tokens - 1  # the last new token is never fed back
    cache = KVCache.create(model.module_spec, batch, slots, weight.dtype, device)
    mask = torch.zeros(batch, slots, dtype=torch.long, device=device)  # [B, S]
    mask[:, :prompt_len] = torch.as_tensor(prompts.mask)
    eos_t = torch.tensor(eos, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    steps = []

    start = time.perf_counter()
    ids = torch.as_tensor(prompts.ids, device=device)
    with torch_decode_ops.prompts():  # the prompt's rows: the CPU's row operators in C where they apply
        last = model(ids, attention_mask=mask[:, :prompt_len], cache=cache, last_only=True)[:, -1]  # [B, V]
    prefill_done = time.perf_counter()
    for step in range(max_new_tokens):
        token = pick(last)  # [B]
        token = torch.where(finished, eos_t[0] if eos else token, token)
        finished |= torch.isin(token, eos_t)
        steps.append(token.cpu().numpy())
        if stream is not None:
            stream(step, steps[-1])
        if step == max_new_tokens - 1 or bool(finished.all()):  # under TP tokens agree: ranks stop together
            break
        mask[:, prompt_len + step] = 1
        with torch_decode_ops.decode_steps():  # one token per row: the CPU's small operators in C where they apply
            last = model(token[:, None], attention_mask=mask[:, : prompt_len + step + 1], cache=cache, last_only=True)
        last = last[:, -1]  # [B, V]
    end = time.perf_counter()
    return Generation(collect_tokens(steps, eos), prefill_done - start, end - prefill_done, None)
