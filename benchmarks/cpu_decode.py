"""CPU prefill and decode throughput: torch_impl, jax_impl and transformers on one Qwen3-0.6B-shaped model
(or, `--model qwen3-moe`, the mixture-of-experts Qwen3-30B-A3B shape scaled down: benchmarks/qwen3_shape.py).

One run measures, on this machine and at batch 1 in float32 or (`--dtype bfloat16`) with bfloat16 weights:
- prefill tokens/s for a 128-token prompt (in each run the median of three: decode_backend.PREFILL_SAMPLES) and
  decode tokens/s for 64 new tokens, per backend (medians of `--repeats` runs; the three backends load in their own
  processes (benchmarks/decode_backend.py), then run in turn, run after run, each backend's variants below in its
  own process);
- the machine's read bandwidth (a large float32 matrix-vector product, read before and after the backends and
  right before and after each run) and matmul FLOP/s, each in a process of its own (benchmarks/bandwidth.py);
- each backend's ratio to transformers, and decode's fraction of the weight-streaming limit
  (read bandwidth / weight bytes per token: every weight is read once per decoded token, 2.38 GB in float32,
  1.19 GB in bfloat16; in the MoE model only the selected experts' weights, 0.21 GB of its 1.54 GB in float32,
  printed beside the dense equivalent): of the highest bandwidth read in the whole run, and (median over the
  runs) of each run's own, the mean of the readings beside it;
- the machine (processor, cores, the flags that decide the fast CPU paths: benchmarks/machine.py), and the
  path each backend's products took per shape with what choosing cost (torch_impl/linear.py,
  jax_impl/linear.py);
- torch_impl's decode against the same model with its decode steps' norms, RoPE and attention kept on the
  reference operators (REFERENCE_OPS: what kernels/cpu/decode_ops.c is worth on this machine), and against the
  same model with those operators in C but called one by one (PER_OPERATOR: what running a layer's decode step as
  one call, kernels/cpu/decode_layer.c, is worth); jax_impl's against the same model with its decode steps' layers
  left to XLA's operators (JAX_PER_OPERATOR: what the same layer call, through XLA's FFI, is worth); each of these
  comparisons run by run (paired_ratio: the variants of one process run one after the other, every other run in
  reverse order), where the ratios to transformers are of the medians, as issue 13's floors are stated.
`--json PATH` writes the same figures. Timings are never asserted in tests: this script is where they live.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: its own folder would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import spec  # noqa: E402
from benchmarks import machine as machine_info  # noqa: E402
from benchmarks.bandwidth import Probe, in_subprocess  # noqa: E402
from benchmarks.decode_backend import JAX_PER_OPERATOR, PER_OPERATOR, REFERENCE_OPS, VARIANTS  # noqa: E402
from benchmarks.qwen3_shape import SHAPES, active_parameters, shaped_checkpoint  # noqa: E402
from benchmarks.worker import Worker  # noqa: E402

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
SUSPECT_PROBE = 0.75  # readings beside the runs all below this share of both fresh processes' readings: not usable
PROBE_REPEATS = 3  # 1 GiB reads per reader per reading beside a run: ~0.3 s, short beside the run it brackets


def fractions(result: dict) -> str:
    """A backend's decode as fractions of the limits (main says which)."""
    return (
        f"{100 * result['decode_fraction_of_limit']:.0f}% of the weight-streaming limit "
        f"({100 * result['decode_fraction_of_adjacent_limit']:.0f}% of each run's own, "
        f"{100 * result['decode_fraction_of_typical_limit']:.0f}% of the median reading's)"
    )


def run_ratios(runs: list[float], baseline: list[float]) -> list[float]:
    """A variant's decode over another's, run by run. The two ran in the same run of the benchmark, in the same
    process, one right after the other, so each ratio compares them at one minute's read rate; a ratio of the two
    medians would compare rates measured minutes apart, which on these VMs' read rate (it moves by up to 2x within a
    minute) decides a near-tie by the machine, not by the variants."""
    return [a / b for a, b in zip(runs, baseline, strict=True)]


def paired_ratio(runs: list[float], baseline: list[float]) -> float:
    """The median of `run_ratios`."""
    return statistics.median(run_ratios(runs, baseline))


def rule_verdict(runs: list[float], baseline: list[float]) -> bool | None:
    """Whether a variant decoded at least as fast as another (jax_impl's layer rule: the call against the operators)
    run by run: True when it did in every run, False when it was slower in every run, None when the runs fall on
    both sides, whichever side their median lands on. A sign test's reading: with five runs, only five of five is
    unlikely by chance where the two are equal (1 in 32); four of five happens 6 times in 32."""
    faster = [ratio >= 1 for ratio in run_ratios(runs, baseline)]
    return True if all(faster) else False if not any(faster) else None


def backend_command(args: argparse.Namespace, backend: str) -> list[str]:
    """The arguments of `python` that start `backend`'s process (benchmarks/decode_backend.py)."""
    cmd = ["-m", "benchmarks.decode_backend", backend, "--prompt-len", str(args.prompt_len),
           "--new-tokens", str(args.new_tokens), "--dtype", args.dtype, "--model", args.model]  # fmt: skip
    if args.jax_compilation_cache:
        cmd += ["--jax-compilation-cache", str(args.jax_compilation_cache.resolve())]
    return cmd


def interleaved_backends(args: argparse.Namespace) -> dict[str, dict]:
    """Every backend in its own process (torch's OpenMP threads and XLA's thread pool never share the cores), its
    variants (VARIANTS) in that process over the one model it loaded: six models resident at once left the
    bandwidth probe's readings beside the runs at 0.5-0.8x of a fresh process's (docs/benchmarks.md). All loaded
    first, then every variant measured in turn, run after run: a drift in the machine's speed (these VMs drift by
    10-20% within minutes) hits every backend alike, so their ratios hold within one run of this script."""
    workers = {backend: Worker(backend_command(args, backend)) for backend in VARIANTS}  # loaded one after another
    names = [name for variants in VARIANTS.values() for name in variants]
    owner = {name: backend for backend, variants in VARIANTS.items() for name in variants}
    runs = {name: [] for name in names}
    probe = Probe(PROBE_REPEATS)
    for repeat in range(args.repeats):
        reading = probe.read()
        # Every other run in reverse order: a variant and the one it is compared with (paired_ratio) take turns
        # going first, so neither is always the one the machine's drift within a run favours.
        for name in names if repeat % 2 == 0 else names[::-1]:  # each between two readings: its own minute's limit
            run, before, reading = workers[owner[name]].ask(f"run {name}"), reading, probe.read()
            runs[name].append({**run, "read_bandwidth": (before + reading) / 2})
    probe.close()
    paths = {backend: worker.ask("paths") for backend, worker in workers.items()}
    for worker in workers.values():
        worker.close()
    results = {}
    for name in names:
        prefill, decode = [r["prefill"] for r in runs[name]], [r["decode"] for r in runs[name]]
        ready = workers[owner[name]].ready
        results[name] = {"prefill_tok_s": statistics.median(prefill), "decode_tok_s": statistics.median(decode),
                         "prefill_runs": prefill, "decode_runs": decode,
                         "adjacent_read_bandwidths": [r["read_bandwidth"] for r in runs[name]],
                         "first_run_s": ready["first_run_s"][name],
                         "compilation_cache_entries": ready["compilation_cache_entries"],
                         **paths[owner[name]]}  # fmt: skip
        r = results[name]
        print(f"  {name:18s} prefill {r['prefill_tok_s']:8.1f} tok/s   decode {r['decode_tok_s']:6.2f} tok/s "
              f"(runs: decode {', '.join(f'{d:.2f}' for d in decode)})")  # fmt: skip
        if r["paths"] and name != VARIANTS[owner[name]][0]:
            print(f"  {'':18s} paths: {owner[name]}'s (the same process)")
        elif r["paths"]:
            taken = ", ".join(f"{shape}: {path}" for shape, path in r["paths"].items())
            cost = f"choosing took {r['choice_cost_s']:.2f} s ({r['choice_decode_cost_s']:.2f} s the decode shapes)"
            if r["choice_others_busy"] is not None:
                cost += f" (other processes used {r['choice_others_busy']:.0%} of the CPUs meanwhile)"
            print(f"  {'':18s} paths (rows in out dtype, bias or layout): {taken}; {cost}")
        first = f"the first run (its compilations and choices included) took {r['first_run_s']:.1f} s"
        if r["compilation_cache_entries"] is not None:
            first += (f", with JAX's persistent compilation cache at {args.jax_compilation_cache} "
                      f"({r['compilation_cache_entries']} entries before it)")  # fmt: skip
        print(f"  {'':18s} {first}")
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="float32", help="the weights' dtype")
    parser.add_argument("--model", choices=tuple(SHAPES), default="qwen3-0.6b", help="the checkpoint's shape")
    parser.add_argument(
        "--jax-compilation-cache",
        type=Path,
        help="JAX's persistent compilation cache for jax_impl (every program, the timing programs of its path choice "
        "included): a later run with the same directory starts from the programs this one compiled",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.jax_compilation_cache:  # refused here, before any worker starts
        try:
            args.jax_compilation_cache.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"--jax-compilation-cache {args.jax_compilation_cache}: not a usable directory ({err})")
    directory = shaped_checkpoint(args.model, args.dtype)  # written once, before any timing
    model_spec = spec.ModelSpec.from_pretrained(directory)
    weight_bytes = active_parameters(model_spec) * DTYPE_BYTES[args.dtype]  # what one decoded token reads
    dense_bytes = spec.parameter_count(model_spec) * DTYPE_BYTES[args.dtype]
    print(machine_info.line())
    print(
        f"{args.model}-shaped, {args.dtype}, batch 1, prompt {args.prompt_len}, {args.new_tokens} new tokens, "
        f"median of {args.repeats}; each backend in its own process, the backends taken in turn"
    )
    if model_spec.num_experts:
        print(
            f"  mixture of experts: {model_spec.num_experts_per_tok} of {model_spec.num_experts} experts per token "
            f"in {len(model_spec.sparse_layers)} layers: a decoded token reads {weight_bytes / 1e9:.3f} GB of the "
            f"{dense_bytes / 1e9:.3f} GB of weights (x{dense_bytes / weight_bytes:.1f} fewer than dense)"
        )
    machine = in_subprocess("machine", args)
    flops = machine["matmul_flops"]
    print(f"  matmul {flops / 1e9:.0f} GFLOP/s, weights {weight_bytes / 1e9:.2f} GB/token")
    results = interleaved_backends(args)
    # Read before and after the backends too. The highest of every reading is the run's limit: a backend set against
    # it was measured against the machine at its best minute. Each run's own limit is the mean of the readings just
    # before and after it (Probe): these VMs' read rate moves by nearly 2x within a minute (docs/benchmarks.md), so that
    # is the fraction of what the machine could read while the backend ran. And the median of every reading: some VMs'
    # rate bursts (an AMD EPYC's: 120 of 132 readings in a minute at 26-36 GB/s, 12 at 45-57 for a second or two), and
    # a burst is no rate a run of several seconds can hold, yet it sets the highest reading, and lowers the own limit's
    # fraction of the run it falls beside; the median is the machine's typical minute.
    ends = [machine["read_bandwidth"], in_subprocess("bandwidth", args)["read_bandwidth"]]
    adjacent = [bw for name in results for bw in results[name]["adjacent_read_bandwidths"]]
    bandwidth, typical = max(ends + adjacent), statistics.median(ends + adjacent)
    limit = bandwidth / weight_bytes
    print(
        f"  read bandwidth {' / '.join(f'{r / 1e9:.1f}' for r in ends)} GB/s (before / after the backends), "
        f"{min(adjacent) / 1e9:.1f}-{max(adjacent) / 1e9:.1f} GB/s beside the runs (median of all "
        f"{typical / 1e9:.1f}); the highest -> decode limit {limit:.2f} tok/s"
    )
    suspect = max(adjacent) < SUSPECT_PROBE * min(ends)
    if suspect:
        print(
            f"  WARNING: every reading beside the runs ({max(adjacent) / 1e9:.1f} GB/s at most) fell below "
            f"{SUSPECT_PROBE:.0%} of both fresh processes' ({min(ends) / 1e9:.1f} GB/s at least): the probe's own "
            f"process read slowly (seen once with six backends resident), not the machine, so the fractions of each "
            f"run's own limit below are not usable in this run; take those of the highest reading"
        )
    for name in results:
        r = results[name]
        r["decode_fraction_of_limit"] = r["decode_tok_s"] / limit
        r["decode_fraction_of_adjacent_limit"] = statistics.median(
            rate * weight_bytes / bw for rate, bw in zip(r["decode_runs"], r["adjacent_read_bandwidths"], strict=True)
        )
        r["decode_fraction_of_typical_limit"] = r["decode_tok_s"] * weight_bytes / typical
    base = results["transformers"]
    for name in ("torch_impl", "jax_impl"):
        r = results[name]
        r["prefill_ratio"] = r["prefill_tok_s"] / base["prefill_tok_s"]
        r["decode_ratio"] = r["decode_tok_s"] / base["decode_tok_s"]
        print(
            f"  {name:18s} prefill x{r['prefill_ratio']:.2f}  decode x{r['decode_ratio']:.2f} of transformers, "
            f"decode at {fractions(r)}"
        )
    ref_ops, per_op = results[REFERENCE_OPS], results[PER_OPERATOR]
    torch_runs, jax_runs = results["torch_impl"]["decode_runs"], results["jax_impl"]["decode_runs"]
    print(
        f"  torch_impl's decode-step operators in C (kernels/cpu/decode_ops.c), called one by one: decode "
        f"x{paired_ratio(per_op['decode_runs'], ref_ops['decode_runs']):.2f} (run by run) over the same model on the "
        f"reference operators, which decode at {fractions(ref_ops)}"
    )
    print(
        f"  torch_impl's decode step in one call (kernels/cpu/decode_layer.c, its layers stacked): decode "
        f"x{paired_ratio(torch_runs, per_op['decode_runs']):.2f} (run by run) over the same model calling those "
        f"operators one by one, which decodes at {fractions(per_op)}"
    )
    jax_per_op = results[JAX_PER_OPERATOR]
    one_call = results["jax_impl"]["one_call_ratio"] = paired_ratio(jax_runs, jax_per_op["decode_runs"])
    held = results["jax_impl"]["layer_rule_held"] = rule_verdict(jax_runs, jax_per_op["decode_runs"])
    pairs = run_ratios(jax_runs, jax_per_op["decode_runs"])
    verdict = {
        True: "held in every run of this one",
        False: "did NOT hold: the operators decoded faster in every run of this one",
        None: f"this run does not settle: {sum(r >= 1 for r in pairs)} of {len(pairs)} runs at least as fast (run by "
        f"run x{min(pairs):.3f} to x{max(pairs):.3f}); only runs that all agree settle it",
    }[held]
    print(
        f"  jax_impl's layers each one call in a decode step (kernels/cpu/decode_layer_ffi.cc): decode "
        f"x{one_call:.2f} (run by run; the medians' ratio x"
        f"{results['jax_impl']['decode_tok_s'] / jax_per_op['decode_tok_s']:.2f}) over the same model with its "
        f"layers as XLA's operators, which decodes at {fractions(jax_per_op)}; jax_impl/layer_choice.py takes the "
        f"call by rule, which {verdict}"
    )
    print(f"  transformers  decode at {fractions(base)}")
    results["machine"] = {
        **machine_info.describe(),
        "dtype": args.dtype,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "read_bandwidth_readings_gb_s": [r / 1e9 for r in ends],
        "read_bandwidth_median_gb_s": typical / 1e9,
        "matmul_gflop_s": flops / 1e9,
        "model": args.model,
        "weight_bytes_per_token": weight_bytes,
        "dense_weight_bytes": dense_bytes,
        "decode_limit_tok_s": limit,
        "adjacent_readings_suspect": suspect,
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
