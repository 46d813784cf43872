"""Ask a server's grpc.health.v1 service whether it serves: the container health check.

    python -m services.common.health_probe HOST:PORT [--service NAME] [--timeout S]
                                           [--tls-ca CA --tls-cert CERT --tls-key KEY]

Exit code 0 when the answer is SERVING, 1 otherwise (NOT_SERVING, as a server
says while it stops; no answer within the timeout; refused), with one line
saying which, what Docker's HEALTHCHECK expects. Every OMRU service serves
the health service without a token; etcd serves it too. Behind mutual TLS the
probe must present a certificate of the CA (the service's own will do) and
dial an address the server's certificate names (make-certs puts 127.0.0.1 in
every one). The address and the TLS files default to $OMRU_HEALTH_ADDRESS and
$OMRU_TLS_CA/$OMRU_TLS_CERT/$OMRU_TLS_KEY (as for the omru client).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from omru.cli.plannerargs import TLS_ENV
from services.common.channels import open_channel
from services.common.config import ConfigError, TlsConfig, add_tls_args, check_endpoint, tls_config

ADDRESS_ENV = "OMRU_HEALTH_ADDRESS"


async def check(address: str, service: str = "", tls: TlsConfig | None = None, timeout_s: float = 5.0) -> str:
    """The status name the server at address gives for service ("" = the server as a whole)."""
    async with open_channel(address, tls=tls, deadline=timeout_s) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                               timeout=timeout_s)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.common.health_probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("address", nargs="?", default=env.get(ADDRESS_ENV),
                        help=f"server host:port (default ${ADDRESS_ENV})")
    parser.add_argument("--service", default="", help="service name to ask about (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)")
    add_tls_args(parser, f"present it (mutual TLS; default ${TLS_ENV['tls_cert']}, ${TLS_ENV['tls_key']})",
                 f"speak TLS and verify the server against it (default ${TLS_ENV['tls_ca']})")
    args = parser.parse_args(argv)
    try:
        if not args.address:
            raise ConfigError(f"no address: give HOST:PORT or set ${ADDRESS_ENV}")
        check_endpoint("address", args.address)
        paths = {k: getattr(args, k) or env.get(name) or None for k, name in TLS_ENV.items()}
        tls = tls_config(paths["tls_cert"], paths["tls_key"], paths["tls_ca"])
    except ConfigError as exc:
        print(f"health_probe: error: {exc}", file=sys.stderr)
        return 1
    try:
        status = asyncio.run(check(args.address, args.service, tls, args.timeout))
    except grpc.aio.AioRpcError as exc:
        print(f"{args.address}: no answer: {exc.code().name}: {exc.details()}")
        return 1
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    raise SystemExit(main())
