"""Decode-step GEMV speed by weight layout and library: what bounds a CPU decode step's weight streaming.

A batch-1 decode step is 28 layers of matrix-vector products (Qwen3-0.6B: q, k, v, o, gate_up, down per
layer, 1.68 GB of float32 weights, 0.84 GB in bfloat16), each weight read once. This script runs exactly those
products, chained layer by layer over distinct weights (nothing stays in cache), in each way the two backends
could run them:

- jax, Flax layout:   x @ W   with W [in, out]   (nnx.Linear's kernel, XLA's single dot: jax_impl's "dot")
- jax, Flax, split:   the same product as 8 row blocks of W and a sum (jax_impl/linear.py's "split")
- jax, Flax, pad:     the row padded to two, a matrix product for XLA's library dot (jax_impl's "pad")
- jax, torch layout:  x @ W^T with W [out, in]   (the same product on the checkpoint's layout)
- torch, F.linear:    MKL's float32 GEMM/GEMV, oneDNN in bfloat16 (what nn.Linear, hence transformers, runs)
- torch, oneDNN:      torch.ops.mkldnn._linear_pointwise (torch_impl/linear.py's "onednn")
- both, the CPU kernel: kernels/cpu/gemv.c in each backend's layout (the backends' "gemv")

and prints each one's streaming rate and its fraction of a 1 GiB float32 matrix-vector product measured in the
same run (the read bandwidth benchmarks/cpu_decode.py uses for its weight-streaming limit). The backends choose
among their forms per shape at first use (torch_impl/linear.py, jax_impl/linear.py); this script pins each.

    python benchmarks/gemv_layout.py [--repeats 10] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.bandwidth import interleaved_medians, matvec_bandwidths  # noqa: E402
from benchmarks.machine import line  # noqa: E402

LAYERS = 28
HIDDEN, Q_OUT, KV_OUT, INTER = 1024, 2048, 1024, 3072  # Qwen3-0.6B
# (name, in, out); the input of each product is a slice of an earlier output, as in the real layer.
PRODUCTS = (("q", HIDDEN, Q_OUT), ("k", HIDDEN, KV_OUT), ("v", HIDDEN, KV_OUT), ("o", Q_OUT, HIDDEN),
            ("gate_up", HIDDEN, 2 * INTER), ("down", INTER, HIDDEN))  # fmt: skip
LINEAR_DIMS = (((1,), (0,)), ((), ()))  # nnx.Linear's dimension numbers: x[m, in] @ W[in, out]
LAYER_PARAMS = sum(i * o for _, i, o in PRODUCTS)


def layer_weights(rng: np.random.Generator, dtype: str) -> list[list[np.ndarray]]:
    """Per layer, per product: W [out, in] (the checkpoint's layout) in `dtype`."""
    import ml_dtypes

    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    return [
        [(rng.standard_normal((o, i), np.float32) * i**-0.5).astype(np_dtype) for _, i, o in PRODUCTS]
        for _ in range(LAYERS)
    ]


def chain(x, weights, product: Callable):
    """One decode step's products: q/k/v/gate_up from the hidden state, o from q, down from gate_up."""
    for q_w, k_w, v_w, o_w, gu_w, down_w in weights:
        q, k, v = product(x, q_w), product(x, k_w), product(x, v_w)
        gate_up = product(x, gu_w)
        x = x + product(q, o_w) + product(gate_up[:, :INTER], down_w) + 1e-3 * (k + v)
    return x


def jax_rates(weights: list[list[np.ndarray]], repeats: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp

    from jax_impl.linear import dot_general

    x = jnp.ones((1, HIDDEN), weights[0][0].dtype)
    hi = jax.lax.Precision.HIGHEST
    flax = [[jnp.asarray(np.ascontiguousarray(w.T)) for w in layer] for layer in weights]  # [in, out] arrays
    torch_layout = [[jnp.asarray(w) for w in layer] for layer in weights]  # contiguous [out, in] arrays

    def form(path: str):
        return lambda x, w: dot_general(x, w, LINEAR_DIMS, precision=hi, path=path)

    variants = {
        "jax x @ W, W [in, out] (Flax, dot)": (flax, form("dot")),
        "jax x @ W split (split)": (flax, form("split")),
        "jax x @ W padded to 2 rows (pad)": (flax, form("pad")),
        "jax x @ W, the CPU kernel (gemv)": (flax, form("gemv")),
        "jax x @ W^T, W [out, in] (torch)": (torch_layout, lambda x, w: jnp.einsum("bi,oi->bo", x, w, precision=hi)),
    }
    runs = {}
    for name, (placed, product) in variants.items():
        step = jax.jit(lambda x, ws, product=product: chain(x, ws, product))
        runs[name] = lambda step=step, placed=placed: step(x, placed).block_until_ready()
    nbytes = LAYERS * LAYER_PARAMS * x.dtype.itemsize
    return {name: nbytes / t for name, t in interleaved_medians(runs, repeats).items()}


def torch_rates(weights: list[list[np.ndarray]], repeats: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    from torch_impl.linear import linear

    dtype = torch.bfloat16 if weights[0][0].dtype.itemsize == 2 else torch.float32
    x = torch.ones(1, HIDDEN, dtype=dtype)
    # [out, in]; bfloat16 through float32 (numpy has no bfloat16 torch can share), float32 shared with numpy
    placed = [[torch.from_numpy(np.asarray(w, np.float32)).to(dtype) for w in layer] for layer in weights]

    def path(name: str):
        return lambda: chain(x, placed, lambda x, w: linear(x, w, path=name))

    runs = {"torch F.linear (f_linear)": lambda: chain(x, placed, F.linear),
            "torch oneDNN (onednn)": path("onednn"), "torch the CPU kernel (gemv)": path("gemv")}  # fmt: skip
    nbytes = LAYERS * LAYER_PARAMS * x.element_size()
    with torch.inference_mode():
        return {name: nbytes / t for name, t in interleaved_medians(runs, repeats).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args(argv)
    weights = layer_weights(np.random.default_rng(0), args.dtype)
    size = {"float32": 4, "bfloat16": 2}[args.dtype]
    print(line())
    print(f"{LAYERS} layers of Qwen3-0.6B GEMVs, {LAYERS * LAYER_PARAMS * size / 1e9:.2f} GB {args.dtype}, batch 1, "
          f"median of {args.repeats}")  # fmt: skip
    rates = {**jax_rates(weights, args.repeats), **torch_rates(weights, args.repeats)}
    rates.update({f"{name} 1 GiB matvec": rate for name, rate in matvec_bandwidths(args.repeats).items()})
    limit = max(rate for name, rate in rates.items() if name.endswith("1 GiB matvec"))
    for name, rate in rates.items():
        print(f"  {name:34s} {rate / 1e9:6.1f} GB/s   {100 * rate / limit:4.0f}% of the best 1 GiB matvec")
    flax, torch_layout = rates["jax x @ W, W [in, out] (Flax, dot)"], rates["jax x @ W^T, W [out, in] (torch)"]
    split, pad = rates["jax x @ W split (split)"], rates["jax x @ W padded to 2 rows (pad)"]
    f_linear, onednn = rates["torch F.linear (f_linear)"], rates["torch oneDNN (onednn)"]
    jax_gemv, torch_gemv = rates["jax x @ W, the CPU kernel (gemv)"], rates["torch the CPU kernel (gemv)"]
    print(f"  jax: split / single dot x{split / flax:.2f}, pad / single dot x{pad / flax:.2f}, gemv / single dot "
          f"x{jax_gemv / flax:.2f}, torch layout / Flax layout x{torch_layout / flax:.2f};  torch: oneDNN / F.linear "
          f"x{onednn / f_linear:.2f}, gemv / oneDNN x{torch_gemv / onednn:.2f}")  # fmt: skip
    print("  (a path the machine cannot run falls back to the single dot / F.linear: kernels/cpu/build.py says why)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
