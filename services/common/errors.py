"""gRPC error helpers shared by the servicers.

Errors are status codes whose message names the bad value; servicers raise
these through `abort_*` helpers or let `EtcdUnavailable` surface, which
`grpc_errors` maps to UNAVAILABLE. A message is at most MAX_MESSAGE bytes
(the rest is cut and counted): it travels in a trailer, and one over the
client's metadata limit reaches the client as RESOURCE_EXHAUSTED instead of
the code sent. Values a message echoes go through `omru.spec.shown`.
"""

from __future__ import annotations

import functools
import inspect
from typing import NoReturn

import grpc

from omru.spec import shown
from services.common.etcd import EtcdUnavailable, Fenced

#: Longest status message sent, in UTF-8 bytes (gRPC clients refuse trailers over 8 KiB by default).
MAX_MESSAGE = 2048


def bounded(message: str) -> str:
    """`message`, cut to MAX_MESSAGE bytes with "...(N chars)" when longer."""
    data = message.encode()
    if len(data) <= MAX_MESSAGE:
        return message
    return f"{data[:MAX_MESSAGE - 32].decode(errors='ignore')}...({len(message)} chars)"


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with `code` and `message` (bounded)."""
    await context.abort(code, bounded(message))
    raise AssertionError("unreachable")  # context.abort raises


async def abort_invalid(context: grpc.aio.ServicerContext, field: str, problem: str) -> NoReturn:
    """INVALID_ARGUMENT naming the field: "<field>: <problem>"."""
    await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {problem}")


async def abort_not_found(context: grpc.aio.ServicerContext, field: str, value: object) -> NoReturn:
    """NOT_FOUND naming the field and its value."""
    await abort(context, grpc.StatusCode.NOT_FOUND, f"{field} {shown(value)} not found")


async def require(context: grpc.aio.ServicerContext, field: str, value: object) -> None:
    """INVALID_ARGUMENT when a required field is empty or zero."""
    if not value:
        await abort_invalid(context, field, "is required")


def grpc_errors(method):
    """Decorate a servicer method: etcd outages and writes fenced off become UNAVAILABLE."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self, request, context):
            try:
                async for item in method(self, request, context):
                    yield item
            except (EtcdUnavailable, Fenced) as exc:  # (fenced: another server leads; the client retries there)
                await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

        return stream

    @functools.wraps(method)
    async def unary(self, request, context):
        try:
            return await method(self, request, context)
        except (EtcdUnavailable, Fenced) as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    return unary
