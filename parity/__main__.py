"""The `decoder-parity` command line (also `python -m parity`): a parser with one subcommand per module.

Each subcommand lives in its own small module that defines `register(subparsers)`: it adds its parser
and sets `run=<function(args) -> int>` as a default. To add one, write the module and import it here.

Exit codes (docs/design.md, "The error policy"): 0 success (parity holds), 1 the check ran and parity does
not hold, 2 bad input (a missing directory, an unsupported config, a broken checkpoint, bad ids, a bad
option), with a message on stderr that names the problem, and 3 an internal error: any other exception,
reported in one line (the traceback with --debug). Python itself exits 1 on an uncaught exception, which a
script would read as "parity does not hold"; 3 keeps a crash of the tool apart from a finding about the model.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from parity import cli_check, cli_generate

PROG = "decoder-parity"
EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="One Qwen3/Qwen2/Llama decoder in PyTorch and JAX, and the parity suite that compares them.",
    )
    parser.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (cli_check, cli_generate):
        module.register(subparsers)
    for sub in subparsers.choices.values():  # also after the subcommand; SUPPRESS keeps the top-level value
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script passes it to sys.exit)."""
    from spec import DecoderParityError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: --help exits 0, a usage error 2; return it instead of exiting
        return exit_.code if isinstance(exit_.code, int) else EXIT_BAD_INPUT
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    name = f"{PROG} {args.command}"
    try:
        return int(args.run(args))
    except DecoderParityError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # every other exception is a bug in this tool, and is reported as one
        if args.debug:
            traceback.print_exc()
        summary = str(err).splitlines()[0][:300] if str(err) else ""
        print(
            f"{name}: internal error: {type(err).__name__}: {summary}"
            + ("" if args.debug else " (run with --debug for the traceback)"),
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
