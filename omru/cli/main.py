"""The `omru` command line.

Every module in `omru.cli.commands` is a subcommand: it defines
`register(subparsers)`, which adds its parser and sets `func` (a callable taking
the parsed arguments and returning an exit code). Modules import heavy
dependencies (torch, grpc, scipy) inside their handlers, so `omru --help` stays
fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from omru.cli import commands
from omru.cli.errors import CliError

__all__ = ["CliError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omru",
        description="Plan and run many DNN training jobs on one shared GPU cluster.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"omru {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `omru ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
