"""Client channels to OMRU services.

`open_channel` returns a grpc.aio channel whose service config retries
UNAVAILABLE on the idempotent methods only (and nothing else), whose unary
calls get a default deadline when the caller gives none, and which sends the
bearer token when one is given. Streaming calls keep no default deadline
(watches run for as long as the caller wants); pass `timeout=` to bound them.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc

#: Deadline (seconds) of unary calls made without an explicit timeout.
DEFAULT_DEADLINE_S = 5.0

#: Methods safe to retry after UNAVAILABLE: reads, and writes that are
#: idempotent by contract (same request twice = same effect).
IDEMPOTENT_METHODS: dict[str, tuple[str, ...]] = {
    "omru.v1.RegistryService": (
        "KeepAliveNode", "DeregisterNode", "GetNode", "ListNodes", "ClaimGpus",
        "ReleaseGpus", "ListClaims", "PutJob", "GetJob", "ListJobs",
    ),
    "omru.v1.ExecutorService": ("StartJob", "ResizeJob", "StopJob", "GetJobs"),
    "omru.v1.ProfilerService": ("GetProfile",),
    "omru.v1.PlannerService": ("SubmitJobs", "CancelJob", "GetPlan", "GetReport"),
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


class _Defaults(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """Adds the bearer token to every call and a default deadline to unary calls."""

    def __init__(self, token: str | None, deadline: float) -> None:
        self._token = token
        self._deadline = deadline

    def _details(self, details: grpc.aio.ClientCallDetails, unary: bool) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*tuple(details.metadata or ()))
        if self._token and "authorization" not in metadata:
            metadata.add("authorization", f"Bearer {self._token}")
        timeout = details.timeout if details.timeout is not None or not unary else self._deadline
        return grpc.aio.ClientCallDetails(details.method, timeout, metadata, details.credentials, details.wait_for_ready)

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details, True), request)

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details, False), request)


def open_channel(
    target: str,
    token: str | None = None,
    root_cert_file: Path | None = None,
    deadline: float = DEFAULT_DEADLINE_S,
) -> grpc.aio.Channel:
    """A channel to target ("host:port"); TLS when root_cert_file is given."""
    options = [
        ("grpc.service_config", service_config()),
        ("grpc.enable_retries", 1),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]
    interceptors = [_Defaults(token, deadline)]
    if root_cert_file is not None:
        credentials = grpc.ssl_channel_credentials(Path(root_cert_file).read_bytes())
        return grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
