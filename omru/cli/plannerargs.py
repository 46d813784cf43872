"""What the planner-facing subcommands share: the address/token/TLS options and the client."""

from __future__ import annotations

import argparse
import os

DEFAULT_PLANNER = "127.0.0.1:50051"
#: Environment defaults of --tls-ca, --tls-cert, --tls-key.
TLS_ENV = {"tls_ca": "OMRU_TLS_CA", "tls_cert": "OMRU_TLS_CERT", "tls_key": "OMRU_TLS_KEY"}


def add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--planner", default=None,
                        help=f"planner address host:port (default: $OMRU_PLANNER or {DEFAULT_PLANNER})")
    parser.add_argument("--token", default=None, help="bearer token (default: $OMRU_AUTH_TOKEN)")
    add_tls(parser)


def add_tls(parser: argparse.ArgumentParser) -> None:
    """--tls-ca (speak TLS, verify the server) and --tls-cert/--tls-key (the client certificate of mutual TLS)."""
    from services.common.config import add_tls_args

    add_tls_args(parser, f"present it for mutual TLS; default ${TLS_ENV['tls_cert']}, ${TLS_ENV['tls_key']}",
                 f"speak TLS and verify the server against it (default ${TLS_ENV['tls_ca']})")


def tls(args: argparse.Namespace):
    """The TlsConfig of the options (else the environment), None for plaintext; CliError names a bad file."""
    from omru.cli.main import CliError
    from services.common.config import ConfigError, tls_config

    paths = {k: getattr(args, k, None) or os.environ.get(env) or None for k, env in TLS_ENV.items()}
    try:
        return tls_config(paths["tls_cert"], paths["tls_key"], paths["tls_ca"])
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def client(args: argparse.Namespace):
    """A SyncClient for the parsed options (CliError on a bad address)."""
    from omru.cli.main import CliError
    from omru.client import SyncClient

    address = args.planner or os.environ.get("OMRU_PLANNER") or DEFAULT_PLANNER
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise CliError(f"--planner {address!r} is not host:port")
    return SyncClient(address, token=args.token or os.environ.get("OMRU_AUTH_TOKEN"), tls=tls(args))


def rpc_error(exc) -> "Exception":
    """A CliError for a failed call: the status code and the planner's message."""
    from omru.cli.main import CliError

    return CliError(f"planner said {exc.code().name}: {exc.details()}")
