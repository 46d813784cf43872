"""Client channels to OMRU services.

`open_channel` returns a grpc.aio channel whose service config retries
UNAVAILABLE on the idempotent methods only (and nothing else), whose unary
calls get a default deadline when the caller gives none, and which sends the
bearer token when one is given; with a `TlsConfig` it speaks TLS, verifies
the server against the CA and presents its own certificate when it has one
(mutual TLS). Streaming calls keep no default deadline
(watches run for as long as the caller wants); pass `timeout=` to bound them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import grpc

from services.common.config import TlsConfig

#: Deadline (seconds) of unary calls made without an explicit timeout.
DEFAULT_DEADLINE_S = 5.0

#: Methods safe to retry after UNAVAILABLE: reads, and writes that are
#: idempotent by contract (same request twice = same effect).
IDEMPOTENT_METHODS: dict[str, tuple[str, ...]] = {
    "omru.v1.RegistryService": ("KeepAliveNode", "DeregisterNode", "GetNode", "ListNodes", "ListClaims"),
    "omru.v1.ExecutorService": ("GetJobs",),
    "omru.v1.ProfilerService": ("GetProfile",),
    "omru.v1.PlannerService": ("SubmitJobs", "CancelJob", "GetPlan", "ListJobs", "GetReport"),
    "grpc.health.v1.Health": ("Check",),
}


def service_config() -> str:
    """The JSON service config: retry policy for the idempotent methods."""
    names = [{"service": svc, "method": m} for svc, methods in IDEMPOTENT_METHODS.items() for m in methods]
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": names,
                    "retryPolicy": {
                        "maxAttempts": 4,
                        "initialBackoff": "0.1s",
                        "maxBackoff": "1s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )


class _Defaults:
    """Adds the bearer token to every call and a default deadline to unary calls.

    One object per call kind: grpc.aio files an interceptor under the first
    kind it implements only, so one class for both would skip the streams."""

    def __init__(self, token: str | None, deadline: float) -> None:
        self._token = token
        self._deadline = deadline

    def _details(self, details: grpc.aio.ClientCallDetails, unary: bool) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*tuple(details.metadata or ()))
        if self._token and "authorization" not in metadata:
            metadata.add("authorization", f"Bearer {self._token}")
        timeout = details.timeout if details.timeout is not None or not unary else self._deadline
        return grpc.aio.ClientCallDetails(details.method, timeout, metadata, details.credentials, details.wait_for_ready)


class _UnaryDefaults(_Defaults, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details, True), request)


class _StreamDefaults(_Defaults, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details, False), request)


class _BidiDefaults(_Defaults, grpc.aio.StreamStreamClientInterceptor):
    """(Server reflection's one call: it needs the token too.)"""

    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details, False), request_iterator)


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """Client credentials: the CA to verify the server (None: system roots), the own certificate if any."""
    def read(path: Path | None) -> bytes | None:
        return None if path is None else Path(path).read_bytes()

    return grpc.ssl_channel_credentials(read(tls.ca_file), read(tls.key_file), read(tls.cert_file))


def open_channel(
    target: str,
    token: str | None = None,
    tls: TlsConfig | None = None,
    deadline: float = DEFAULT_DEADLINE_S,
    interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    options: Sequence[tuple[str, object]] = (),
    server_name: str = "",
) -> grpc.aio.Channel:
    """A channel to target ("host:port"); TLS when tls is given.

    server_name (TLS only): the name the server's certificate must carry
    instead of target's host (a service identity such as "omru-planner").
    interceptors run inside the defaults (they see the deadline and token);
    options are extra channel arguments."""
    if server_name and tls is not None:
        options = [*options, ("grpc.ssl_target_name_override", server_name)]
    options = [
        ("grpc.service_config", service_config()),
        ("grpc.enable_retries", 1),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        *options,
    ]
    interceptors = [_UnaryDefaults(token, deadline), _StreamDefaults(token, deadline), _BidiDefaults(token, deadline),
                    *interceptors]
    if tls is not None:
        return grpc.aio.secure_channel(target, channel_credentials(tls), options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
