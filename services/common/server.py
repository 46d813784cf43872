"""gRPC server bootstrap shared by every OMRU service.

`start_server` binds a grpc.aio server (port 0 works: the bound port is
returned), adds the health and reflection services, optional TLS (mutual
when the config names a CA: clients without a certificate it signed are
refused in the handshake) and an optional bearer-token interceptor.
`serve_forever` prints one JSON ready line on stdout (what `omru up` waits
for), then runs until SIGTERM/SIGINT and stops gracefully (health
NOT_SERVING first, then a grace period).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common import authz
from services.common.config import ServerConfig
from services.common.logging import get_logger

log = get_logger(__name__)

#: Seconds the stop hooks (closing clients, dispatchers) may take beyond the grace period.
STOP_HOOKS_S = 10.0


@dataclass(frozen=True)
class Service:
    """One servicer to serve: the generated add_XxxServicer_to_server, the servicer, its full name."""

    add_to_server: Callable[[Any, grpc.aio.Server], None]
    servicer: Any
    full_name: str


def service_name(pb2_module, name: str) -> str:
    """Full name ("omru.v1.RegistryService") of a service in a generated module."""
    return pb2_module.DESCRIPTOR.services_by_name[name].full_name


@dataclass
class RunningServer:
    """A started server: its grpc.aio server, bound port and health servicer."""

    server: grpc.aio.Server
    host: str
    port: int
    health: Any
    service_names: tuple[str, ...]
    grace_seconds: float
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    metrics: Any = None  # its MetricsServer (services/common/metrics.py), when it serves metrics

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        """Mark NOT_SERVING, run the on_stop hooks, stop with a grace period."""
        await self.health.enter_graceful_shutdown()
        for hook in self.on_stop:
            try:
                await hook()
            except Exception as exc:  # a failing hook must not keep the server up
                log.warning("stop_hook_failed", error=str(exc))
        await self.server.stop(self.grace_seconds if grace is None else grace)


async def start_server(config: ServerConfig, services: Sequence[Service]) -> RunningServer:
    """Bind and start a server for the services, with health and reflection."""
    mutual = config.tls is not None and config.tls.ca_file is not None
    authenticator = authz.Authenticator(config.tokens, config.auth_token, mutual_tls=mutual)
    interceptors = [authz.AuthzInterceptor(authenticator)] if authenticator.enforcing else []
    server = grpc.aio.server(interceptors=interceptors, options=[("grpc.so_reuseport", 0)])
    names = tuple(s.full_name for s in services)
    for s in services:
        s.add_to_server(s.servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    target = f"{config.host}:{config.port}"
    if config.tls is not None:
        ca = config.tls.ca_file.read_bytes() if config.tls.ca_file is not None else None
        credentials = grpc.ssl_server_credentials([(config.tls.key_file.read_bytes(), config.tls.cert_file.read_bytes())],
                                                  root_certificates=ca, require_client_auth=ca is not None)
        port = server.add_secure_port(target, credentials)
    else:
        port = server.add_insecure_port(target)
    if port == 0:
        raise OSError(f"cannot listen on {target}")
    await server.start()
    for name in ("", *names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("server_started", address=f"{config.host}:{port}", services=list(names), tls=config.tls is not None,
             mutual_tls=mutual, auth=authenticator.enforcing)
    return RunningServer(server, config.host, port, health_servicer, names, config.grace_seconds)


def print_ready(**info: Any) -> None:
    """The one JSON ready line on stdout that launchers wait for."""
    print(json.dumps({"ready": True, **info}), flush=True)


async def serve_forever(running: RunningServer, service: str, **ready_info: Any) -> None:
    """Print the ready line, then serve until SIGTERM/SIGINT and stop gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if running.metrics is not None:
        ready_info = {**ready_info, "metrics": running.metrics.address}
    print_ready(service=service, address=running.address, port=running.port, **ready_info)
    waiter = asyncio.ensure_future(running.server.wait_for_termination())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    log.info("server_stopping", address=running.address)
    try:  # a stop that hangs (a hook or stream waiting on a peer that is gone) must not keep the process
        await asyncio.wait_for(running.stop(), running.grace_seconds + STOP_HOOKS_S)
    except asyncio.TimeoutError:
        log.error("server_stop_timed_out", address=running.address)
        os._exit(1)
    for task in (waiter, stopper):
        task.cancel()
    log.info("server_stopped", address=running.address)


def run_main(service: str, parse_config: Callable[[list[str] | None, Mapping[str, str]], Any], serve: Callable[[Any], Awaitable[None]], argv: list[str] | None = None) -> int:
    """A server's main(): set up logging, read the config from argv and the
    environment (the only place it is read), serve; a bad config exits 2 with one line."""
    import os

    from services.common.config import ConfigError
    from services.common.logging import configure

    configure(service)
    if os.environ.get("OMRU_DIE_WITH_PARENT") == "1":
        from services.common.cluster import die_with_parent

        die_with_parent()
    try:
        config = parse_config(argv, os.environ)
    except ConfigError as exc:
        print(f"{service}: error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(config))
    return 0
