"""The `decoder-parity` command line (also `python -m parity`): a parser with one subcommand per module.

Each subcommand lives in its own small module that defines `register(subparsers)`: it adds its parser
and sets `run=<function(args) -> int>` as a default. To add one (e.g. `generate` in parity/cli_generate.py),
write the module and list it in SUBCOMMANDS; a listed module that does not exist yet is skipped.

Exit codes: 0 success (parity holds), 1 the check ran and parity does not hold, 2 bad input (a missing
directory, an unsupported config, a broken checkpoint, bad ids, a bad option), with a message on stderr
that names the problem.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

PROG = "decoder-parity"
# Modules that each register one subcommand, in the order `--help` lists them.
SUBCOMMANDS = ("parity.cli_check", "parity.cli_generate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="One Qwen3/Qwen2/Llama decoder in PyTorch and JAX, and the parity suite that compares them.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:  # not written yet: skip it; a missing dependency inside it is a real error
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script passes it to sys.exit)."""
    from spec import DecoderParityError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: --help exits 0, a usage error 2; return it instead of exiting
        return exit_.code if isinstance(exit_.code, int) else 2
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.run(args))
    except DecoderParityError as err:
        print(f"{PROG} {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
