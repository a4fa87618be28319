"""Decode-step GEMV speed by weight layout and library: what bounds a CPU decode step's weight streaming.

A batch-1 decode step is 28 layers of matrix-vector products (Qwen3-0.6B: q, k, v, o, gate_up, down per
layer, 1.68 GB of float32 weights), each weight read once. This script runs exactly those products, chained
layer by layer over distinct weights (nothing stays in cache), in each way the two backends could run them:

- jax, Flax layout:   x @ W   with W [in, out]   (nnx.Linear's kernel, XLA's single dot)
- jax, Flax, split:   the same product as 8 row blocks of W and a sum (jax_impl/linear.py; what jax_impl runs)
- jax, torch layout:  x @ W^T with W [out, in]   (the same product on the checkpoint's layout)
- torch, F.linear:    MKL's float32 GEMM/GEMV    (what nn.Linear, hence transformers, runs on CPU)
- torch, oneDNN:      torch.ops.mkldnn._linear_pointwise (what torch_impl/linear.py runs for float32)

and prints each one's streaming rate and its fraction of a 1 GiB matrix-vector product measured in the same
run (the read bandwidth benchmarks/cpu_decode.py uses for its weight-streaming limit).

    python benchmarks/gemv_layout.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.cpu_decode import interleaved_medians, matvec_bandwidths  # noqa: E402

LAYERS = 28
HIDDEN, Q_OUT, KV_OUT, INTER = 1024, 2048, 1024, 3072  # Qwen3-0.6B
# (name, in, out); the input of each product is a slice of an earlier output, as in the real layer.
PRODUCTS = (("q", HIDDEN, Q_OUT), ("k", HIDDEN, KV_OUT), ("v", HIDDEN, KV_OUT), ("o", Q_OUT, HIDDEN),
            ("gate_up", HIDDEN, 2 * INTER), ("down", INTER, HIDDEN))  # fmt: skip
LINEAR_DIMS = (((1,), (0,)), ((), ()))  # nnx.Linear's dimension numbers: x[m, in] @ W[in, out]
LAYER_BYTES = sum(i * o for _, i, o in PRODUCTS) * 4


def layer_weights(rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Per layer, per product: W [out, in] float32 (the checkpoint's layout)."""
    return [[rng.standard_normal((o, i), np.float32) * i**-0.5 for _, i, o in PRODUCTS] for _ in range(LAYERS)]


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

    x = jnp.ones((1, HIDDEN), jnp.float32)
    hi = jax.lax.Precision.HIGHEST
    flax = [[jnp.asarray(w.T) for w in layer] for layer in weights]  # contiguous [in, out] arrays
    torch_layout = [[jnp.asarray(w) for w in layer] for layer in weights]  # contiguous [out, in] arrays
    variants = {
        "jax x @ W, W [in, out] (Flax)": (flax, lambda x, w: jnp.dot(x, w, precision=hi)),
        "jax x @ W split (jax_impl)": (flax, lambda x, w: dot_general(x, w, LINEAR_DIMS, precision=hi)),
        "jax x @ W^T, W [out, in] (torch)": (torch_layout, lambda x, w: jnp.einsum("bi,oi->bo", x, w, precision=hi)),
    }
    runs = {}
    for name, (placed, product) in variants.items():
        step = jax.jit(lambda x, ws, product=product: chain(x, ws, product))
        runs[name] = lambda step=step, placed=placed: step(x, placed).block_until_ready()
    return {name: LAYERS * LAYER_BYTES / t for name, t in interleaved_medians(runs, repeats).items()}


def torch_rates(weights: list[list[np.ndarray]], repeats: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    from torch_impl.linear import linear

    x = torch.ones(1, HIDDEN)
    placed = [[torch.from_numpy(w) for w in layer] for layer in weights]  # [out, in], shared with numpy
    runs = {"torch F.linear (MKL)": lambda: chain(x, placed, F.linear),
            "torch oneDNN (torch_impl)": lambda: chain(x, placed, linear)}  # fmt: skip
    with torch.inference_mode():
        return {name: LAYERS * LAYER_BYTES / t for name, t in interleaved_medians(runs, repeats).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    weights = layer_weights(np.random.default_rng(0))
    print(f"{LAYERS} layers of Qwen3-0.6B GEMVs, {LAYERS * LAYER_BYTES / 1e9:.2f} GB float32, batch 1, "
          f"median of {args.repeats}")  # fmt: skip
    rates = {**jax_rates(weights, args.repeats), **torch_rates(weights, args.repeats)}
    rates.update({f"{name} 1 GiB matvec": rate for name, rate in matvec_bandwidths(args.repeats).items()})
    limit = max(rates["jax 1 GiB matvec"], rates["torch 1 GiB matvec"])
    for name, rate in rates.items():
        print(f"  {name:34s} {rate / 1e9:6.1f} GB/s   {100 * rate / limit:4.0f}% of the best 1 GiB matvec")
    flax, torch_layout = rates["jax x @ W, W [in, out] (Flax)"], rates["jax x @ W^T, W [out, in] (torch)"]
    split = rates["jax x @ W split (jax_impl)"]
    mkl, onednn = rates["torch F.linear (MKL)"], rates["torch oneDNN (torch_impl)"]
    print(f"  jax: split / single dot x{split / flax:.2f}, torch layout / Flax layout x{torch_layout / flax:.2f};  "
          f"torch: oneDNN / MKL x{onednn / mkl:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
