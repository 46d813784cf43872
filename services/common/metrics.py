"""Prometheus metrics of a service: its own registry, collectors, and the HTTP server of /metrics.

Every service serves its metrics when started with ``--metrics-port PORT`` (0: any free port; the
bound address is the ``metrics`` entry of its ready line; absent: no metrics server). `start_metrics`
starts a `MetricsServer` next to the gRPC server, on the same ``--host``, and stops it first when
the service stops. The server speaks what the gRPC server does: with ``--tls-cert`` HTTPS with that
certificate (with ``--tls-ca`` only to clients presenting a certificate that CA signed), and when the
service knows tokens (``--auth-token-file``, ``$OMRU_AUTH_TOKEN``, ``--auth-tokens``) it answers only
requests that send ``Authorization: Bearer <token>`` (Prometheus: ``authorization: {credentials_file:
...}``) with the token of an admin or of the ``metrics`` role (`authz.METRICS_READERS`; a scraper's
token of that role reads metrics and calls no RPC): 401 without a known token, 403 for another role.

Each service has its own `CollectorRegistry` (several services in one process do not collide), and
its families are named ``omru_*``. Most are read from the service's live state when scraped
(`LoopBridge` runs the reading on the service's event loop, where that state lives, so no scrape
sees it half-changed); counters and histograms hold only what must be counted as it happens.
`EtcdErrors` exposes the failed etcd calls an `EtcdStore` counted (``omru_etcd_errors_total``).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
import threading
from typing import Any, Callable, Iterable, Mapping
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer

from services.common import authz
from services.common.config import ServerConfig, TlsConfig
from services.common.logging import get_logger

log = get_logger(__name__)

#: Seconds a scrape waits for the service's event loop to read its state (a busy loop: the families
#: read there are left out of that scrape, and a log line says so).
READ_TIMEOUT_S = 5.0


class LoopBridge:
    """Calls made from a scrape's HTTP thread, run on the service's event loop (where its state lives)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()

    def call(self, fn: Callable[[], Any], timeout: float = READ_TIMEOUT_S) -> Any:
        """fn() (a function or a coroutine function) run on the loop; its result. Raises what it raised,
        or TimeoutError when the loop did not get to it in time."""
        async def run():
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise


class LoopCollector:
    """A collector whose state is read on the event loop: subclasses give `describe` (the families,
    empty) and `read` (a snapshot, run on the loop) and `families(snapshot)`."""

    name = "service"

    def __init__(self, bridge: LoopBridge) -> None:
        self.bridge = bridge

    def read(self) -> Any:  # runs on the loop
        raise NotImplementedError

    def families(self, snapshot: Any) -> Iterable:
        raise NotImplementedError

    def describe(self) -> Iterable:
        return list(self.families(None))

    def collect(self) -> Iterable:
        try:
            snapshot = self.bridge.call(self.read)
        except Exception as exc:  # (a scrape must still return the other families)
            log.warning("metrics_read_failed", collector=self.name, error=str(exc) or type(exc).__name__)
            return []
        return list(self.families(snapshot))


class Meter:
    """A service's counters and histograms (`metrics`: what it counts as it happens) and, once bound,
    a LoopCollector of its live state (`live`), collected together."""

    metrics: tuple = ()
    live: LoopCollector | None = None

    def describe(self) -> Iterable:
        for metric in (*self.metrics, *([self.live] if self.live is not None else [])):
            yield from metric.describe()

    def collect(self) -> Iterable:
        for metric in (*self.metrics, *([self.live] if self.live is not None else [])):
            yield from metric.collect()


class EtcdErrors:
    """``omru_etcd_errors_total{op, kind}``: the failed calls an EtcdStore counted (its `errors`)."""

    def __init__(self, store) -> None:
        self.store = store

    def describe(self) -> Iterable:
        yield CounterMetricFamily("omru_etcd_errors", "Failed etcd calls, by operation and error kind",
                                  labels=["op", "kind"])

    def collect(self) -> Iterable:
        family = CounterMetricFamily("omru_etcd_errors", "Failed etcd calls, by operation and error kind",
                                     labels=["op", "kind"])
        for (op, kind), n in sorted(dict(self.store.errors).items()):  # (a copy: the loop may add one)
            family.add_metric([op, kind], n)
        yield family


class _Handler(WSGIRequestHandler):
    timeout = 30.0  # seconds a client may take to send its request (and, over TLS, to handshake)

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):  # here, in the request's thread: a slow or plaintext
            self.connection.do_handshake()  # client holds up no other scrape, nor the server's stop

    def log_message(self, format, *args) -> None:  # scrapes are not worth a log line each
        pass


class _Server(ThreadingWSGIServer):
    def handle_error(self, request, client_address) -> None:  # a failed handshake, a client gone: one line
        log.info("metrics_request_failed", peer=str(client_address[0]), error=str(sys.exc_info()[1])[:200])


def _authorized(app, authenticator: authz.Authenticator):
    def checked(environ, start_response):
        sent = environ.get("HTTP_AUTHORIZATION", "")
        p = authenticator.principal((("authorization", sent),) if sent else (), {})
        if isinstance(p, str):
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
            return [f"{p} bearer token (send 'Authorization: Bearer <token>')\n".encode()]
        if p.kind not in authz.METRICS_READERS:
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [f"{p} may not read metrics (allowed: {', '.join(authz.METRICS_READERS)})\n".encode()]
        return app(environ, start_response)

    return checked


def _ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    if tls.ca_file is not None:
        context.load_verify_locations(str(tls.ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class MetricsServer:
    """/metrics (any path, as prometheus_client serves) of one registry over HTTP(S), in a thread."""

    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0,
                 tokens: Mapping[str, authz.Principal] = {}, admin_token: str | None = None,
                 tls: TlsConfig | None = None) -> None:
        """tokens (token -> principal) and admin_token (the legacy token): the service's, as its gRPC server's."""
        self.registry, self.host, self.requested_port = registry, host, port
        self.authenticator, self.tls = authz.Authenticator(tokens, admin_token), tls
        self._httpd = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1] if self._httpd is not None else 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "MetricsServer":
        app = make_wsgi_app(self.registry)
        if self.authenticator.enforcing:
            app = _authorized(app, self.authenticator)
        server_class = _Server
        if ":" in self.host.strip("[]"):  # an IPv6 address
            server_class = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        try:
            httpd = make_server(self.host.strip("[]"), self.requested_port, app, server_class, handler_class=_Handler)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {self.host}:{self.requested_port}: {exc.strerror}") from exc
        if self.tls is not None:
            httpd.socket = _ssl_context(self.tls).wrap_socket(httpd.socket, server_side=True,
                                                              do_handshake_on_connect=False)
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"metrics-{self.port}", daemon=True)
        self._thread.start()
        log.info("metrics_serving", address=self.address, tls=self.tls is not None, auth=self.authenticator.enforcing)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.stop)


def new_registry(*collectors) -> CollectorRegistry:
    """A registry of its own with the process's metrics (process_*) and the given collectors."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    for collector in collectors:
        if collector is not None:
            registry.register(collector)
    return registry


async def start_metrics(running, config: ServerConfig, *collectors) -> MetricsServer | None:
    """Serve the collectors when config asks for metrics (`ServerConfig.metrics_port`); the server stops
    first when `running` (a RunningServer) stops, and its address is in the ready line."""
    if config.metrics_port is None:
        return None
    try:
        server = MetricsServer(new_registry(*collectors), config.host, config.metrics_port, tokens=config.tokens,
                               admin_token=config.auth_token, tls=config.tls).start()
    except BaseException:
        await running.stop(0)
        raise
    running.metrics = server
    running.on_stop.insert(0, server.aclose)  # before what its collectors read is closed
    return server
