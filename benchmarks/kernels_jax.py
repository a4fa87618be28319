"""benchmarks/kernels.py's JAX sweep: the Pallas kernels (kernels.pallas) against the reference jax.numpy ops run
eagerly and through jax.jit, on one GPU device.

Mirrors benchmarks/kernels_torch.py (the Triton kernels): the same ops, shapes, variants and record per shape.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

from benchmarks.kernel_figures import EPS, GATED, RMS_NORM_OPTIONS, spec_peak, sweep
from benchmarks.kernel_timing import median_seconds_jax


def donating_step(add_rms_norm: Callable) -> Callable:
    """`add_rms_norm(x, residual, weight) -> (out, new residual)` jitted as a decoder's step runs it, the residual
    donated and fed back: returning (new residual, out), since jit gives a donated buffer to the first output of its
    shape, which must be the new residual, the output the kernel writes over the residual (input_output_aliases);
    given to `out`, XLA would copy one of the two [T, H] arrays every call."""
    import jax

    return jax.jit(lambda x, r, w: add_rms_norm(x, r, w)[::-1], donate_argnums=1)


def _jax_cases(kernel: str, tokens: int, width: int, dtype, device, jitted: dict) -> dict[str, Callable[[], object]]:
    import jax
    import jax.numpy as jnp

    import kernels.pallas as ops

    keys = jax.random.split(jax.random.key(0))
    if kernel in RMS_NORM_OPTIONS:
        options = RMS_NORM_OPTIONS[kernel]
        x, r = (jax.device_put(jax.random.normal(k, (tokens, width), dtype), device) for k in keys)  # [T, H] each
        w = jax.device_put(jnp.ones(width, dtype), device)
        state = {"fused": jnp.copy(r), "compiled": jnp.copy(r)}  # donated buffers, apart from r

        def chained(label: str) -> Callable[[], object]:
            # The residual is donated and fed back, as a decoder would, so that input_output_aliases can
            # update it in place; without donation XLA must copy it first.
            def step() -> object:
                state[label], out = jitted[kernel, label](x, state[label], w)
                return out

            return step

        return {
            "fused": chained("fused"),
            "plain": lambda: ops.add_rms_norm_reference(x, r, w, EPS, **options),
            "compiled": chained("compiled"),
        }
    x = jax.device_put(jax.random.normal(keys[0], (tokens, 2 * width), dtype), device)  # [T, 2I]
    reference = getattr(ops, f"{kernel}_reference")
    return {
        "fused": lambda: jitted[kernel, "fused"](x),
        "plain": lambda: reference(x),
        "compiled": lambda: jitted[kernel, "compiled"](x),
    }


def bench_jax(args: argparse.Namespace, out: dict[str, Any]) -> None:
    import jax
    import jax.numpy as jnp

    import kernels.pallas as ops

    dtype = jnp.dtype(args.dtype)
    device = next(d for d in jax.devices() if d.platform in ("gpu", "cuda", "rocm"))
    peak = spec_peak(device.device_kind, args.peak_gbps)
    src = jax.device_put(jnp.zeros(128 * 2**20, jnp.uint16), device)  # 256 MiB
    invert = jax.jit(lambda a: ~a)  # a pure read+write pass: XLA's stand-in for a device-to-device copy
    copy_gbps = 2 * src.nbytes / median_seconds_jax(lambda: invert(src), args.warmup, args.samples, args.calls) / 1e9
    print(
        f"jax {jax.__version__} on {device.device_kind}: copy {copy_gbps:.0f} GB/s, spec peak {peak or 'unknown'} GB/s"
    )
    out["devices"]["jax"] = device.device_kind
    out["versions"]["jax"] = jax.__version__
    out["copy_gbps"]["jax"] = copy_gbps
    out["spec_peak_gbps"]["jax"] = peak
    jitted = {}  # (kernel, "fused" | "compiled") -> the jitted function
    for kernel, options in RMS_NORM_OPTIONS.items():
        for label, fn in (("fused", ops.add_rms_norm), ("compiled", ops.add_rms_norm_reference)):
            jitted[kernel, label] = donating_step(functools.partial(fn, eps=EPS, **options))
    for kernel in GATED:
        jitted[kernel, "fused"] = jax.jit(getattr(ops, kernel))
        jitted[kernel, "compiled"] = jax.jit(getattr(ops, f"{kernel}_reference"))
    cases_of = functools.partial(_jax_cases, dtype=dtype, device=device, jitted=jitted)
    sweep("jax", args, out, dtype.itemsize, cases_of, median_seconds_jax, copy_gbps, peak)
