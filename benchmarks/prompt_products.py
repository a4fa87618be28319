"""A prompt's products, form by form: every form each backend can choose for a layer's q, k, v, o, gate_up and down at
a prompt's rows, timed side by side on the same machine.

A prefill is compute-bound, and most of it is these products (a perf profile of jax_impl's bf16 prefill of 128 tokens
on the 0.6B shape put 68% of its time in them: docs/benchmarks.md). Each backend chooses a form per shape by a short
measurement at first use (jax_impl/linear.py: XLA's single dot, the project's `gemm` kernel, for bfloat16 its
`upcast`; torch_impl/linear.py: F.linear, oneDNN, `upcast_blocks`, on AVX-512 `upcast`, on AMX `gemm`). This
script times every form that applies, in rounds (each form once per round, the order rotating), and prints each one's
rate (GFLOP/s) and its ratio to the framework's own op measured in the same rounds (jax: "dot", torch: "f_linear"),
then a layer's products (k and v both counted) on each backend's fastest form per shape against the framework's op
alone.

    python benchmarks/prompt_products.py [--dtype float32] [--rows 128] [--rounds 15] [--shape qwen3-0.6b]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.machine import describe, line  # noqa: E402
from benchmarks.qwen3_shape import SHAPES  # noqa: E402
from spec import ModelSpec  # noqa: E402

BASELINES = {"jax": "dot", "torch": "f_linear"}  # each framework's own op


def layer_products(spec: ModelSpec) -> list[tuple[str, int, int]]:
    """(name, in, out) of a dense layer's prompt products, in the order the layer runs them."""
    if spec.num_experts:
        raise ValueError(f"prompt_products: a dense layer only; {spec.model_type} has {spec.num_experts} experts")
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    nq, nk = spec.num_attention_heads * d, spec.num_key_value_heads * d
    return [("q", h, nq), ("k", h, nk), ("v", h, nk), ("o", nq, h), ("gate_up", h, 2 * inter), ("down", inter, h)]


def candidates(shape: tuple[int, int], rows: int, dtype: str, seed: int) -> dict[str, Callable[[], object]]:
    """{"jax/<form>" | "torch/<path>": a call computing x [rows, in] @ W} for every form each backend offers here."""
    import jax
    import jax.numpy as jnp
    import torch

    from jax_impl import linear as jax_linear
    from torch_impl import linear as torch_linear

    in_, out = shape
    gen = np.random.default_rng(seed)
    x, w = gen.standard_normal((rows, in_), np.float32), gen.standard_normal((in_, out), np.float32) / in_**0.5
    jx, jw = jnp.asarray(x, dtype), jnp.asarray(w, dtype)  # W [in, out]: Flax's layout
    tx = torch.from_numpy(x).to(getattr(torch, dtype))
    tw = torch.from_numpy(np.ascontiguousarray(w.T)).to(getattr(torch, dtype))  # [out, in]: nn.Linear's
    calls = {}
    dims = (((1,), (0,)), ((), ()))
    for form in jax_linear.forms_for(jx, jw, dims):
        run = jax.jit(lambda x, w, form=form: jax_linear.dot_general(x, w, dims, path=form))
        calls[f"jax/{form}"] = lambda run=run: run(jx, jw).block_until_ready()
    with torch.inference_mode():
        paths = torch_linear.forms_for(tx, tw, None)
    for path in paths:
        calls[f"torch/{path}"] = lambda path=path: _torch_call(torch_linear.linear, tx, tw, path)
    return calls


def _torch_call(linear, x, w, path: str) -> object:
    import torch

    with torch.inference_mode():
        return linear(x, w, None, path=path)


def measure(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Each call's median seconds over `rounds` rounds, every call once a round, the order rotating; one unmeasured
    round first (compilation, packing buffers, path set-up)."""
    names = list(calls)
    for name in names:
        calls[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def summarize(products: list[tuple[str, int, int]], seconds: dict[tuple[int, int], dict[str, float]]) -> dict:
    """Per backend: a layer's seconds on the framework's op alone and on the fastest form of each shape."""
    layer = {}
    for backend, base in BASELINES.items():
        own = best = 0.0
        for _, in_, out in products:
            timed = {k.split("/", 1)[1]: s for k, s in seconds[(in_, out)].items() if k.startswith(f"{backend}/")}
            own, best = own + timed[base], best + min(timed.values())
        layer[backend] = {"baseline_s": own, "fastest_s": best, "ratio": own / best}
    return layer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--rows", type=int, default=128, help="a prompt's tokens (more than a decode step's)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--shape", choices=sorted(s for s, spec in SHAPES.items() if not spec.num_experts),
                        default="qwen3-0.6b")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if args.rows < 9 or args.rounds < 1:
        parser.error("--rows must be at least 9 (a prompt's products, not a decode step's) and --rounds at least 1")
    print(line())
    products = layer_products(SHAPES[args.shape])
    flops = 2 * args.rows * sum(in_ * out for _, in_, out in products)
    print(f"{args.shape}, {args.dtype}, {args.rows} rows: a layer's products {flops / 1e9:.2f} GFLOP", flush=True)
    seconds = {}
    for seed, (in_, out) in enumerate(dict.fromkeys((in_, out) for _, in_, out in products)):
        seconds[(in_, out)] = measure(candidates((in_, out), args.rows, args.dtype, seed), args.rounds)
        rate = {name: 2 * args.rows * in_ * out / s / 1e9 for name, s in seconds[(in_, out)].items()}
        base = {name: rate[f"{name.split('/')[0]}/{BASELINES[name.split('/')[0]]}"] for name in rate}
        cells = "; ".join(f"{name} {r:.0f} (x{r / base[name]:.2f})" for name, r in rate.items())
        print(f"  {in_}->{out}: GFLOP/s {cells}", flush=True)
    layer = summarize(products, seconds)
    for backend, t in layer.items():
        print(
            f"  {backend}: a layer's products {t['fastest_s'] * 1e3:.2f} ms on the fastest form per shape, "
            f"{t['baseline_s'] * 1e3:.2f} ms on {BASELINES[backend]} alone (x{t['ratio']:.2f})"
        )
    if args.json is not None:
        figures = {
            "machine": describe(), "shape": args.shape, "dtype": args.dtype, "rows": args.rows, "rounds": args.rounds,
            "layer_flops": flops, "layer": layer,
            "seconds": {f"{i}x{o}": s for (i, o), s in seconds.items()},
        }  # fmt: skip
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
