"""`decoder-parity check [CHECKPOINT_DIR]`: the parity check from the command line.

Prints the component table and a one-line verdict naming the first divergence on stdout, loading progress
and stage lines on stderr. Exit 0 when parity holds, 1 when it does not, 2 for bad input, 3 for an internal
error (parity/__main__.py). Every option is checked before any work: ranges by argparse, output paths by
opening them, the size of the run against the machine's memory (parity/inputs.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kernels import KERNEL_CHOICES
from parity.environment import prepare_environment
from parity.inputs import int_option
from parity.tolerances import TOLERANCES
from spec.errors import InputError
from spec.inputs import MAX_SEED
from spec.json_fields import MAX_SIZE

_positive_int = int_option(1, MAX_SIZE)
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check",
        help="compare the torch and jax backends component by component",
        description="Load one checkpoint into both backends, run the same ids, compare every traced component "
        "(embedding, per-layer norms, q/k, attention, MLP, residual stream, final norm, logits) against the "
        "dtype's tolerance table, and report the first component outside tolerance.",
    )
    p.add_argument(
        "checkpoint",
        nargs="?",
        metavar="CHECKPOINT_DIR",
        help="Hugging Face-layout checkpoint directory (default: the built-in tiny Qwen3)",
    )
    p.add_argument("--dtype", choices=list(TOLERANCES), default="float32", help="activation dtype of both backends")
    p.add_argument(
        "--kernels",
        choices=list(KERNEL_CHOICES),
        default="reference",
        help="reference ops, fused Triton/Pallas kernels (interpreted on CPU: slow), or auto",
    )
    p.add_argument(
        "--reference",
        choices=["hf"],
        default=None,
        help="also compare both backends with Hugging Face transformers on the components it exposes",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--ids", metavar="IDS", help="token ids, e.g. '1,2,3' (rows separated by ';')")
    source.add_argument("--prompt", metavar="TEXT", help="text, tokenized with the checkpoint's tokenizer.json")
    p.add_argument("--seq-len", type=_positive_int, default=None, help="length of the random ids (default 16)")
    p.add_argument("--batch", type=_positive_int, default=None, help="rows of random ids or prompt copies (default 1)")
    p.add_argument(
        "--seed", type=int_option(0, MAX_SEED), default=0, help="seed of the random ids, in [0, 2**63) (default 0)"
    )
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the float32 runs that measure a bf16/fp16 run's own drift (faster)",
    )
    p.add_argument("--tp", type=_positive_int, default=1, help="also run both backends tensor-parallel on N devices")
    p.add_argument(
        "--ep",
        type=_positive_int,
        default=1,
        help="mixture-of-experts models: also run both backends expert-parallel, experts sharded over N ranks "
        "(times --tp), and compare their logits",
    )
    p.add_argument(
        "--teacher-forced-routing",
        action="store_true",
        help="mixture-of-experts models: give jax (and transformers with --reference hf) torch's expert choices, so "
        "the experts' arithmetic is compared even where a near-tie sent a token elsewhere",
    )
    p.add_argument(
        "--grad",
        action="store_true",
        help="compare the loss and every parameter gradient (backward order) instead of the forward components",
    )
    p.add_argument(
        "--steps",
        type=int_option(0, 10_000),
        default=0,
        metavar="N",
        help="with --grad: also run N AdamW steps in each framework (and tensor-parallel with --tp) and compare the "
        "parameters (implies --grad)",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="hold one decoder layer's weights at a time (an 8B model in a few GB), free-running and teacher-forced; "
        "chosen on its own when the whole-model check would not fit in memory",
    )
    p.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    p.add_argument("--plot", metavar="PATH", help="plot the residual stream's error per layer (png/svg/pdf)")
    p.add_argument("--tolerances", action="store_true", help="print the tolerance table with its reasons and exit")
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="load weights holding NaN/Inf instead of refusing the checkpoint (to debug a broken export)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or stage lines on stderr")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.tolerances:
        from parity.tolerances import describe

        print(describe(TOLERANCES[args.dtype]))
        return 0
    if args.plot is not None and Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"--plot {args.plot}: the format comes from the suffix, one of {', '.join(PLOT_SUFFIXES)}")
    for path in (args.json, args.plot):  # fail before a long run, not after it
        check_writable(path)
    from parity.request import check_stream_options

    check_stream_options(args.stream or None, args.tp, args.grad or args.steps > 0)  # before --tp starts JAX
    # Before anything imports triton or starts JAX (parity/environment.py).
    if args.ep > 1 or args.teacher_forced_routing:  # refused on a dense model before JAX gets ep devices
        from parity.request import check_moe_request

        check_moe_request(args.checkpoint, args.ep, args.teacher_forced_routing)
    prepare_environment(args.kernels, args.tp * args.ep)
    from parity.api import check
    from spec import allow_nonfinite_weights

    def log(line: str) -> None:
        if not args.quiet:
            print(f"[decoder-parity] {line}", file=sys.stderr, flush=True)

    with allow_nonfinite_weights(args.allow_nonfinite):  # reaches both loaders through spec.runtime_params
        report = check(
            args.checkpoint,
            dtype=args.dtype,
            kernels=args.kernels,
            reference=args.reference,
            ids=args.ids,
            prompt=args.prompt,
            seq_len=args.seq_len,
            batch=args.batch,
            seed=args.seed,
            baseline=not args.no_baseline,
            progress=not args.quiet,
            log=log,
            tp=args.tp,
            grad=args.grad or args.steps > 0,
            steps=args.steps,
            stream=True if args.stream else None,
            routing="teacher" if args.teacher_forced_routing else "free",
            ep=args.ep,
        )
    print(report.format())
    if args.json:
        _write(lambda: report.save_json(args.json), args.json)
        log(f"report written to {args.json}")
    if args.plot:
        from parity.plot import plot_report

        plot_report(report, args.plot)
        log(f"plot written to {args.plot}")
    return 0 if report.passed else 1


def check_writable(path: str | Path | None) -> None:
    """Refuse an output path that cannot be written, by opening it for appending (nothing is truncated; a
    file that did not exist is removed again). Permission bits alone would not do: root ignores them, and a
    read-only file system or a full quota shows only when writing."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise InputError(f"cannot write {path}: it is a directory")
    if not target.resolve().parent.is_dir():
        raise InputError(f"cannot write {path}: directory {target.resolve().parent} does not exist")
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as err:
        raise InputError(f"cannot write {path}: {err.strerror or err}") from err
    if not existed:
        target.unlink(missing_ok=True)


def _write(save, path: str) -> None:
    try:
        save()
    except OSError as err:
        raise InputError(f"cannot write {path}: {err}") from err
