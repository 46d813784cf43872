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
import pkgutil
import sys

from omru.cli import commands
from omru.cli.errors import CliError, Unreachable, run

__all__ = ["CliError", "Unreachable", "build_parser", "main", "version"]


def version() -> str:
    """The installed package's version (importlib.metadata), else omru.__version__."""
    from importlib import metadata

    try:
        return metadata.version("omru")
    except metadata.PackageNotFoundError:
        import omru

        return getattr(omru, "__version__", "unknown")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omru",
        description="Plan and run many DNN training jobs on one shared GPU cluster.",
        epilog="Exit codes: 0 done, 1 the work failed, 2 usage error, 3 cannot reach the cluster (none running?).",
    )
    parser.add_argument("--version", action="version", version=f"omru {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args.command, args.func, args)


if __name__ == "__main__":
    sys.exit(main())
