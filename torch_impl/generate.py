"""Autoregressive generation with a KV cache: prefill, then one token per step; greedy or sampled.

Mirrors jax_impl/generate.py. The prompt (left-padded when rows differ in length) fills the cache and
yields the first token; each later step feeds one token per row. Rows that reached an EOS id keep
emitting it (ignored afterwards) until every row is done or `max_new_tokens` is reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from spec.generation import Generation, SamplingParams, collect_tokens, prepare_prompts
from torch_impl.kv_cache import KVCache
from torch_impl.model import CausalLM


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """logits [B, V] float32 -> token ids [B]: argmax, or temperature / top-k / top-p sampling."""
    if params.greedy:
        return logits.argmax(-1)  # ties go to the lowest id
    logits = logits / params.temperature
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
    eos_token_ids: Sequence[int] | None = None,
    stream: Callable[[int, np.ndarray], None] | None = None,
    return_logits: bool = False,
) -> Generation:
    """Generate up to `max_new_tokens` per row. `eos_token_ids` None = the checkpoint's; () = never stop.

    `stream(step, tokens[B])` is called as each token is produced.
    """
    params = SamplingParams(temperature, top_k, top_p, seed)
    if torch.is_tensor(input_ids):
        input_ids = input_ids.cpu().numpy()
    prompts = prepare_prompts(input_ids, model.spec, max_new_tokens, attention_mask)
    eos = tuple(model.eos_token_ids if eos_token_ids is None else eos_token_ids)
    device = model.model.embed_tokens.weight.device
    batch, prompt_len = prompts.ids.shape
    cache = KVCache(model.spec, batch, prompt_len + max_new_tokens, model.model.embed_tokens.weight.dtype, device)
    mask = torch.zeros(batch, prompt_len + max_new_tokens, dtype=torch.long, device=device)  # [B, S]
    mask[:, :prompt_len] = torch.as_tensor(prompts.mask)
    generator = None if params.greedy else torch.Generator(device).manual_seed(params.seed)
    eos_t = torch.tensor(eos, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    steps, logits_seen = [], []

    start = time.perf_counter()
    ids = torch.as_tensor(prompts.ids, device=device)
    logits = model(ids, attention_mask=mask[:, :prompt_len], cache=cache, last_only=True)[:, -1].float()
    prefill_done = time.perf_counter()
    for step in range(max_new_tokens):
        token = sample(logits, params, generator)  # [B]
        token = torch.where(finished, eos_t[0] if eos else token, token)
        finished |= torch.isin(token, eos_t)
        steps.append(token.cpu().numpy())
        if return_logits:
            logits_seen.append(logits.cpu().numpy())
        if stream is not None:
            stream(step, steps[-1])
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        mask[:, prompt_len + step] = 1
        logits = model(token[:, None], attention_mask=mask[:, : prompt_len + step + 1], cache=cache, last_only=True)
        logits = logits[:, -1].float()  # [B, V]
    end = time.perf_counter()
    return Generation(
        collect_tokens(steps, eos), prefill_done - start, end - prefill_done, logits_seen if return_logits else None
    )
