"""A backend's process in benchmarks/cpu_decode.py: it loads the model once, warms up each of its variants, then
answers every "run VARIANT" line with one generation's prefill and decode rates and "paths" with the path each product
shape took (benchmarks/worker.py speaks to it). torch_impl, jax_impl and transformers each get one, so that torch's
OpenMP threads and XLA's thread pool never share the cores.

`python -m benchmarks.decode_backend BACKEND --dtype ... --model ... --prompt-len ... --new-tokens ...`; the
coordinator starts it, never a person. A backend's variants (VARIANTS) are ways of running the one model it loaded:
as shipped first, then with parts of its decode step on other operators (cpu_decode.py says what each comparison
measures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import spec
from benchmarks.qwen3_shape import SHAPES, shaped_checkpoint
from kernels.cpu import gemv_fetch  # the product kernel's software fetch, chosen like a path
from spec.path_choice import Choice

DECODE_ROWS = 8  # a product key of at most this many rows is a decode step's (batch 1 here: 1 row)
# Prompts timed per run, the median kept: a 128-token prefill lasts a few tenths of a second, and one such window on
# these VMs read 264-353 tok/s for the same code within one benchmark run (docs/benchmarks.md).
PREFILL_SAMPLES = 3


class TokenClock:
    """Timestamps of produced tokens: prefill = prompt start to first token, decode = first to last token.

    The same definition for all three backends (ours via `stream`, transformers via its streamer `put`),
    taken within one run, so compilation or prefill noise cannot leak into the decode rate.
    """

    def __init__(self):
        self.start = 0.0
        self.stamps: list[float] = []

    def reset(self) -> None:
        self.stamps = []
        self.start = time.perf_counter()

    def put(self, _value) -> None:  # transformers' streamer API: the prompt first, then each new token
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass

    def __call__(self, _step, _tokens) -> None:  # decoder-parity's stream API
        self.stamps.append(time.perf_counter())


REFERENCE_OPS = "torch_impl/ref-ops"  # torch_impl with its decode steps' norms, RoPE and attention on the reference
PER_OPERATOR = "torch_impl/per-op"  # torch_impl with its decode steps' operators called one by one, not in one call
JAX_PER_OPERATOR = "jax_impl/per-op"  # jax_impl with its decode steps' layers as XLA's operators, not one call each


VARIANTS = {  # per backend's process: the model loaded once, each variant a way of running it (the first: as shipped)
    "transformers": ("transformers",),
    "torch_impl": ("torch_impl", PER_OPERATOR, REFERENCE_OPS),
    "jax_impl": ("jax_impl", JAX_PER_OPERATOR),
}


def variant_context(name: str):
    """The context a variant's generations run in: none for a backend as shipped."""
    if name == REFERENCE_OPS:  # its decode steps' small operators kept on the reference
        from kernels.cpu import torch_decode_ops

        return torch_decode_ops.reference_only
    if name == PER_OPERATOR:  # its decode steps' operators called one at a time
        from kernels.cpu import torch_decode_layer

        return torch_decode_layer.per_operator
    if name == JAX_PER_OPERATOR:  # its decode steps' layers as XLA's operators
        from kernels.cpu import jax_decode_layer

        return jax_decode_layer.per_operator
    return contextlib.nullcontext


def _told(choice: Choice) -> str:
    """A choice as the report gives it: the path, each candidate's best pass and the rule that decided."""
    timed = ", ".join(f"{path} {seconds * 1e3:.2f} ms" for path, seconds in choice.seconds.items())
    rule = f"; {choice.rule}" if choice.rule else ""
    return f"{choice.path} ({timed}{rule})" if timed else f"{choice.path} (by rule, untimed)"


def chosen_paths(name: str) -> dict:
    """The path each product shape took in this process, the seconds choosing cost (all of it, and what is left
    without the prompt's many-row shapes: the decode shapes' cost, which issue 13 budgets at 1 s), and the share of
    the CPUs other processes used meanwhile (None where unknown; our backends only). The product kernel's fetch is
    chosen at its first product, which may be a path choice's untimed warm-up: the total then counts that measurement
    in both (an overstatement of at most its own cost, tens of ms)."""
    if name == "transformers":
        return {"paths": {}, "choice_cost_s": 0.0, "choice_decode_cost_s": 0.0, "choice_others_busy": None}
    paths = __import__(f"{name.split('/')[0]}.linear", fromlist=["PATHS"]).PATHS
    chosen = paths.chosen()
    shapes = {" ".join(map(str, key)): _told(choice) for key, choice in sorted(chosen.items(), key=str)}
    prompt = sum(choice.cost for key, choice in chosen.items() if key[0] > DECODE_ROWS)  # a key's first item: rows
    layers = __import__(f"{name.split('/')[0]}.layer_choice", fromlist=["LAYERS"]).LAYERS  # one call or operators
    for key, choice in layers.chosen().items():
        shapes[f"layer {key[0]} {key[1]}"] = _told(choice)
    for (dtype, layout), choice in gemv_fetch.FETCH.chosen().items():
        shapes[f"kernel fetch {dtype} {layout}"] = _told(choice)
    cost = paths.cost() + gemv_fetch.FETCH.cost()
    return {
        "paths": shapes,
        "choice_cost_s": cost,
        "choice_decode_cost_s": cost - prompt,
        "choice_others_busy": paths.others_busy(),
    }


def load_backend(backend: str, directory: Path, dtype: str, prompt: np.ndarray, new_tokens: int) -> dict:
    """Load the backend's model once; return, per variant of it (VARIANTS), a function that measures one generation
    of `new_tokens` tokens.

    Each measured generation follows a short unmeasured one: a kernel that pages out memory left idle for a
    while (these VMs' does, after about a minute) would otherwise make a memory-mapped model (transformers
    maps the checkpoint) read its weights back from disk during the measured prefill, after the other
    backends' turns."""
    clock = TokenClock()
    if backend == "transformers":
        import torch
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype)).eval()
        ids = torch.as_tensor(prompt)

        def generation(_context) -> Callable[[int], list[float]]:
            def run(n: int = new_tokens) -> list[float]:
                clock.reset()
                with torch.inference_mode():
                    model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                   streamer=clock)  # fmt: skip
                return clock.stamps[1:]  # the streamer's first put is the prompt itself

            return run

    else:
        module = __import__(backend)
        model = module.from_pretrained(directory, dtype, progress=True)

        def generation(context) -> Callable[[int], list[float]]:
            def run(n: int = new_tokens) -> list[float]:
                clock.reset()
                with context():
                    module.generate(model, prompt, n, eos_token_ids=(), stream=clock)
                return clock.stamps

            return run

    def rates_of(run: Callable[[int], list[float]], name: str) -> Callable[[], dict]:
        def rates() -> dict:
            run(2)  # every weight read once, unmeasured
            prefills = []
            for _ in range(PREFILL_SAMPLES - 1):  # a prompt alone: its first token is its prefill
                prefills.append(prompt.shape[1] / (run(1)[0] - clock.start))
            stamps = run(new_tokens)
            assert len(stamps) == new_tokens, (name, len(stamps))
            prefills.append(prompt.shape[1] / (stamps[0] - clock.start))
            return {"prefill": statistics.median(prefills), "decode": (new_tokens - 1) / (stamps[-1] - stamps[0])}

        return rates

    return {name: rates_of(generation(variant_context(name)), name) for name in VARIANTS[backend]}


def serve(backend: str, args: argparse.Namespace) -> None:
    """A backend's worker: load, then warm up each of its variants; then one run per "run VARIANT" line on stdin,
    each answered with one JSON line; "paths" answers with the paths its products took as shipped and what choosing
    cost, read after the first variant's warm-up: a later variant may choose more (jax_impl's per-op variant times
    the decode products its layers' one call leaves unasked), which the backend as shipped never pays for. The
    coordinator takes the variants of all backends in turn."""
    directory = shaped_checkpoint(args.model, args.dtype)
    vocab = spec.ModelSpec.from_pretrained(directory).vocab_size
    prompt = np.random.default_rng(0).integers(0, vocab, (1, args.prompt_len))
    cache = args.jax_compilation_cache if backend == "jax_impl" else None
    entries = use_jax_compilation_cache(cache) if cache else None
    variants = load_backend(backend, directory, args.dtype, prompt, args.new_tokens)
    first, shipped = warm_up(backend, variants)
    print(json.dumps({"ready": backend, "first_run_s": first, "compilation_cache_entries": entries}), flush=True)
    for command in sys.stdin:
        words = command.split()
        reply = variants[words[1]]() if words[0] == "run" else shipped
        print(json.dumps(reply), flush=True)


def warm_up(backend: str, variants: dict[str, Callable[[], dict]]) -> tuple[dict[str, float], dict]:
    """Run each variant once (compilation, the choice of paths, allocator, caches): ({variant: seconds it took}, the
    paths report of the backend as shipped, read right after its first variant)."""
    first, shipped = {}, None
    for name, rates in variants.items():
        start = time.perf_counter()
        rates()
        first[name] = time.perf_counter() - start
        shipped = shipped or chosen_paths(backend)
    return first, shipped


def use_jax_compilation_cache(directory: Path) -> int:
    """Turn on JAX's persistent compilation cache at `directory` for this process, every program included (JAX's
    defaults leave out programs that compile in under a second: the decode steps' products' timing programs are all
    such); return the entries it held before."""
    import jax

    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return sum(1 for _ in directory.iterdir())


def build_parser() -> argparse.ArgumentParser:
    """The worker's command line, as benchmarks/cpu_decode.py's `backend_command` writes it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=tuple(VARIANTS))
    parser.add_argument("--prompt-len", type=int, required=True)
    parser.add_argument("--new-tokens", type=int, required=True)
    parser.add_argument("--dtype", required=True)  # one of cpu_decode.py's DTYPE_BYTES: the coordinator checked it
    parser.add_argument("--model", choices=tuple(SHAPES), required=True)
    parser.add_argument("--jax-compilation-cache", type=Path)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    serve(args.backend, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
