"""What the planner-facing subcommands share: the address/token options and the client."""

from __future__ import annotations

import argparse
import os

DEFAULT_PLANNER = "127.0.0.1:50051"


def add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--planner", default=None,
                        help=f"planner address host:port (default: $OMRU_PLANNER or {DEFAULT_PLANNER})")
    parser.add_argument("--token", default=None, help="bearer token (default: $OMRU_AUTH_TOKEN)")


def client(args: argparse.Namespace):
    """A SyncClient for the parsed options (CliError on a bad address)."""
    from omru.cli.main import CliError
    from omru.client import SyncClient

    address = args.planner or os.environ.get("OMRU_PLANNER") or DEFAULT_PLANNER
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise CliError(f"--planner {address!r} is not host:port")
    return SyncClient(address, token=args.token or os.environ.get("OMRU_AUTH_TOKEN"))


def rpc_error(exc) -> "Exception":
    """A CliError for a failed call: the status code and the planner's message."""
    from omru.cli.main import CliError

    return CliError(f"planner said {exc.code().name}: {exc.details()}")
