"""One training step (forward, loss, backward, AdamW) of the Qwen3-0.6B-shaped checkpoint at batch 1 x 256
tokens: torch_impl, jax_impl and transformers (with torch.optim.AdamW), each in its own process.

Prints, per framework, the median step time over the timed steps (after one warm-up step, which includes
JAX's compilation), the ratio to transformers measured in the same run, and the process's peak RSS
(ru_maxrss: weights, gradients, both Adam moments and the activations the backward keeps), against the
floors of issue 14: step time <= 1.0x transformers', peak memory <= transformers' + 10%. Also the minor page
faults per step: glibc maps every large block fresh and unmaps it when freed, and a step that allocates
gigabytes (XLA's temporaries, autograd's gradients) pays for zeroing them again at every step.

`--keep-freed-memory` runs all three processes with glibc tunables (KEEP_FREED_MEMORY: one arena, no mmap,
no trimming) under which freed memory stays mapped and is reused: the same settings for every framework, so
the ratios stay fair; a process setting, not something a library should change behind its user's back.

    python benchmarks/train_step.py [--dtype float32|bfloat16] [--steps 3] [--rounds 1] [--tokens 256]
                                    [--keep-freed-memory] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks import machine
from benchmarks.qwen3_shape import qwen3_0_6b_checkpoint

FRAMEWORKS = ("hf", "torch", "jax")
# glibc: every thread on the main arena (a thread arena maps any block over 64 MB on its own), no block mapped
# on its own, freed memory never returned: a step's gigabytes of temporaries are faulted in once per process.
KEEP_FREED_MEMORY = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"


def _one(framework: str, path: str, dtype: str, steps: int, tokens: int) -> dict:
    """Run in a child process: warm-up + `steps` timed steps; returns the times and the peak RSS."""
    import numpy as np

    from spec.training import AdamW

    config = AdamW(lr=1e-5)
    from spec import ModelSpec

    ids = np.random.default_rng(0).integers(0, ModelSpec.from_pretrained(path).vocab_size, (1, tokens))
    if framework == "hf":
        from parity.hf_training import HFTrainer

        trainer = HFTrainer(path, config, dtype=dtype)
        step = trainer.step
    else:
        import importlib

        backend = importlib.import_module(f"{framework}_impl")
        training = importlib.import_module(f"{framework}_impl.training")
        model = backend.from_pretrained(path, dtype)
        optimizer = training.make_optimizer(model, config)

        def step(batch):
            return training.train_step(model, optimizer, config, batch)

    step(ids)  # warm-up: JAX compiles, torch allocates the Adam moments
    times, faults = [], []
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        step(ids)
        times.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"step_s": times, "faults_per_step": faults, "peak_rss_gb": peak}


def measure(framework: str, path: Path, dtype: str, steps: int, tokens: int, keep_freed_memory: bool) -> dict:
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from benchmarks.train_step import _one\n"
        f"print(json.dumps(_one({framework!r}, {str(path)!r}, {dtype!r}, {steps}, {tokens})))\n"
    )
    print(f"[train_step] {framework}: {steps} timed steps after a warm-up ...", file=sys.stderr, flush=True)
    env = {**os.environ, "GLIBC_TUNABLES": KEEP_FREED_MEMORY} if keep_freed_memory else None
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{framework} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1, help="processes per framework, the frameworks in turn")
    parser.add_argument("--keep-freed-memory", action="store_true", help="glibc keeps freed memory mapped (all)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    path = qwen3_0_6b_checkpoint(args.dtype)
    print(machine.line())
    print(f"glibc tunables: {KEEP_FREED_MEMORY if args.keep_freed_memory else 'default'}")
    # Rounds take the frameworks in turn (hf, torch, jax, hf, ...): a drift of the shared machine's speed then
    # hits all three alike instead of whichever ran during it. Medians over every timed step of every round.
    runs = {f: [] for f in FRAMEWORKS}
    for r in range(args.rounds):
        for f in FRAMEWORKS:
            runs[f].append(measure(f, path, args.dtype, args.steps, args.tokens, args.keep_freed_memory))
            print(f"  round {r + 1}: {f} steps " + " ".join(f"{t:.2f}" for t in runs[f][-1]["step_s"]), flush=True)
    rows = {}
    for f, per_round in runs.items():
        steps = [t for run in per_round for t in run["step_s"]]
        peak = max(run["peak_rss_gb"] for run in per_round)
        faults = statistics.median(n for run in per_round for n in run["faults_per_step"])
        rows[f] = {"step_s": steps, "median_step_s": statistics.median(steps), "peak_rss_gb": peak,
                   "median_faults_per_step": faults}  # fmt: skip
    hf = rows["hf"]
    print(
        f"Qwen3-0.6B-shaped {args.dtype}, batch 1 x {args.tokens}, AdamW (fused); "
        f"medians of {args.rounds} x {args.steps} steps"
    )
    print(f"{'framework':>12} {'step s':>8} {'vs hf':>6} {'peak RSS GB':>12} {'vs hf':>6} {'faults/step':>12}")
    for name, r in rows.items():
        ratio, mem = r["median_step_s"] / hf["median_step_s"], r["peak_rss_gb"] / hf["peak_rss_gb"]
        print(f"{name:>12} {r['median_step_s']:>8.2f} {ratio:>6.2f} {r['peak_rss_gb']:>12.2f} {mem:>6.2f} "
              f"{r['median_faults_per_step']:>12.0f}")  # fmt: skip
    for name in ("torch", "jax"):
        r = rows[name]
        ok_time = r["median_step_s"] <= hf["median_step_s"]
        ok_mem = r["peak_rss_gb"] <= 1.10 * hf["peak_rss_gb"]
        print(f"floors {name}: step <= 1.0x hf {'met' if ok_time else 'NOT met'}; memory <= hf + 10% "
              f"{'met' if ok_mem else 'NOT met'}")  # fmt: skip
    if args.json:
        settings = {"dtype": args.dtype, "glibc_tunables": KEEP_FREED_MEMORY if args.keep_freed_memory else None}
        Path(args.json).write_text(json.dumps({"machine": machine.describe(), **settings, **rows}, indent=2))


if __name__ == "__main__":
    main()
