"""What the cluster-facing subcommands share: the address/token/TLS options, resolving them
(flag > environment > context > default, omru.context) and the client."""

from __future__ import annotations

import argparse

from omru.context import DEFAULT_PLANNER, TLS_ENV  # noqa: F401  (TLS_ENV: the environment of --tls-*)


def add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--planner", default=None,
                        help=f"planner address host:port (default: $OMRU_PLANNER, else the context `omru up` wrote, "
                             f"else {DEFAULT_PLANNER})")
    add_token(parser)
    add_tls(parser)


def add_token(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token", default=None, help="bearer token (default: $OMRU_AUTH_TOKEN, else the context's)")


def add_tls(parser: argparse.ArgumentParser) -> None:
    """--tls-ca (speak TLS, verify the server) and --tls-cert/--tls-key (the client certificate of mutual TLS)."""
    from services.common.config import add_tls_args

    add_tls_args(parser, f"present it for mutual TLS; default ${TLS_ENV['tls_cert']}, ${TLS_ENV['tls_key']}",
                 f"speak TLS and verify the server against it (default ${TLS_ENV['tls_ca']})")


def connection(args: argparse.Namespace, service: str, flag: str | None = None, default: str | None = None):
    """The omru.context.Connection of `service` for the parsed options: its address checked as host:port
    (CliError), Unreachable when no address is known at all; noted for error messages."""
    from omru import context
    from omru.cli.errors import CliError, Unreachable, hint, note_target

    flag = flag or service
    try:
        conn = context.resolve(service, getattr(args, flag, None), getattr(args, "token", None),
                               {k: getattr(args, k, None) for k in TLS_ENV}, default=default)
    except context.ContextError as exc:
        raise CliError(f"{exc} (fix or remove it, or set ${context.ENV})") from None
    if conn.address is None:
        raise Unreachable(f"no {service} address: no context at {context.path()} ({hint(service)})")
    host, sep, port = conn.address.rpartition(":")
    if not sep or not host or not port.isdigit():
        where = {"flag": f"--{flag}", "env": f"${context.ADDRESS_ENV.get(service, '')}",
                 "context": f"the context's {service}"}.get(conn.source, f"--{flag}")
        raise CliError(f"{where} {conn.address!r} is not host:port")
    note_target(service, conn.address, conn.source, bool(conn.tls_ca or conn.tls_cert))
    return conn


def tls_of(conn):
    """The TlsConfig of a Connection, None for plaintext; CliError names a bad file."""
    from pathlib import Path

    from omru.cli.errors import CliError
    from services.common.config import ConfigError, tls_config

    def p(value):
        return Path(value) if value else None

    try:
        return tls_config(p(conn.tls_cert), p(conn.tls_key), p(conn.tls_ca))
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def tls(args: argparse.Namespace):
    """The TlsConfig of the options (else the environment), None for plaintext; CliError names a bad file."""
    return tls_of(connection(args, "planner", default=DEFAULT_PLANNER))


def client(args: argparse.Namespace):
    """A SyncClient for the parsed options (CliError on a bad address)."""
    from omru.client import SyncClient

    conn = connection(args, "planner", default=DEFAULT_PLANNER)
    return SyncClient(conn.address, token=conn.token, tls=tls_of(conn))


def rpc_error(exc) -> "Exception":
    """The error of a failed call: Unreachable (exit 3) when the planner is not there, else a CliError
    with the status code and the planner's message."""
    from omru.cli.errors import CliError, from_rpc

    return from_rpc(exc) or CliError(f"planner said {exc.code().name}: {exc.details()}")
