"""How fast a decode step's attention reads its KV cache: kernels/cpu/attend.c against the CPU product kernel
reading as many bytes.

A decode step's attention reads every cached key and value of its layer once, from memory: since the layer's last
step, every other layer's weights passed through the caches. So its cache is a stream, like the weights, and this
script sets the one against the other: per cache length, the time of one decode row's attention (Qwen3-0.6B's
heads: 8 KV heads, 2 query heads each, head_dim 128, through torch_decode_ops.attend on the OpenMP team) with the
cache taken out of every cache level first (kernels/cpu/evict.py), beside the few-row product kernel
(kernels/cpu/gemv.c) reading a weight of the same bytes, evicted the same way, the two taken in turn. It prints
each one's read rate and their ratio: what attention leaves of the machine's streaming rate as the context grows.

    python benchmarks/attend_read.py [--repeats 20] [--dtype bfloat16] [--keys 160 1024 4096]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.machine import line  # noqa: E402

KV_HEADS, GROUPS, HEAD_DIM = 8, 2, 128  # Qwen3-0.6B
GEMV_IN = 1024  # the baseline weight's input width (the model's hidden size); its rows make up the bytes


def runs_here() -> bool:
    """Whether the three CPU kernels this script times are built here."""
    from kernels.cpu import evict, torch_decode_ops, torch_gemv

    return torch_decode_ops.available() and torch_gemv.available() and evict.available()


def timed(run, evict) -> float:
    """Seconds of one `run`, after an untimed `evict`."""
    evict()
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(keys: int, dtype, repeats: int) -> dict:
    """One cache length: the attention's and the product kernel's median read rates (bytes/s), run in turn."""
    import torch

    from kernels.cpu import evict, torch_decode_ops, torch_gemv

    gen = torch.Generator().manual_seed(keys)
    q = torch.randn(1, 1, KV_HEADS, GROUPS, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(1, KV_HEADS, keys, HEAD_DIM, generator=gen).to(dtype)  # [B, n_kv, S, d]
    v = torch.randn(1, KV_HEADS, HEAD_DIM, keys, generator=gen).to(dtype)  # [B, n_kv, d, S]
    mask = torch.ones(1, 1, keys, dtype=torch.bool)
    cache_bytes = k.nbytes + v.nbytes
    w = torch.randn(cache_bytes // (GEMV_IN * k.element_size()), GEMV_IN, generator=gen).to(dtype)  # [out, in]
    x = torch.randn(1, GEMV_IN, generator=gen).to(dtype)
    readers = {  # name -> (the call, what takes its operands out of the caches, the bytes it reads)
        "attend": (
            lambda: torch_decode_ops.attend(q, k, v, mask, HEAD_DIM**-0.5),
            evict.evicting([(k.data_ptr(), k.nbytes), (v.data_ptr(), v.nbytes)]),
            cache_bytes,
        ),
        "gemv": (lambda: torch_gemv.launch(x, w), evict.evicting([(w.data_ptr(), w.nbytes)]), w.nbytes),
    }
    seconds = {name: [] for name in readers}
    with torch.inference_mode():
        for run, _, _ in readers.values():
            run()  # warm-up: the libraries' first calls
        for turn in range(repeats):  # in turn, every other turn reversed: neither always reads first
            for name in readers if turn % 2 == 0 else reversed(readers):
                seconds[name].append(timed(*readers[name][:2]))
    rates = {name: readers[name][2] / statistics.median(times) for name, times in seconds.items()}  # bytes/s
    attend_bytes, gemv_bytes = readers["attend"][2], readers["gemv"][2]
    pairs = zip(seconds["attend"], seconds["gemv"], strict=True)
    ratios = [(attend_bytes / a) / (gemv_bytes / g) for a, g in pairs]  # the two read rates, run by run
    return {
        "keys": keys,
        "cache_mb": cache_bytes / 1e6,
        "attend_us": statistics.median(seconds["attend"]) * 1e6,
        "rates": rates,
        "ratio": statistics.median(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--keys", type=int, nargs="+", default=[160, 1024, 4096], help="cache lengths")
    args = parser.parse_args(argv)
    if args.repeats < 1 or min(args.keys) < 1:
        parser.error("--repeats and every --keys must be at least 1")
    import torch

    from kernels.cpu import build

    if not runs_here():
        reason = "; ".join(filter(None, (build.unavailable(name) for name in ("decode_ops", "gemv", "evict"))))
        print(f"attend_read: the CPU kernels do not run here: {reason}", file=sys.stderr)
        return 1
    print(line())
    print(f"one decode row, {KV_HEADS} KV heads x {GROUPS} queries, head_dim {HEAD_DIM}, {args.dtype}, "
          f"{torch.get_num_threads()} threads; medians of {args.repeats}, each read from memory")  # fmt: skip
    for keys in args.keys:
        r = measure(keys, getattr(torch, args.dtype), args.repeats)
        print(f"  {keys:6d} keys ({r['cache_mb']:6.2f} MB of K+V): attention {r['attend_us']:8.1f} us, "
              f"{r['rates']['attend'] / 1e9:5.3g} GB/s; the product kernel on as many bytes "
              f"{r['rates']['gemv'] / 1e9:5.3g} GB/s; attention x{r['ratio']:.2f} of it (run by run)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
