"""The errors of the OMRU SDK (`omru.client`): one class per gRPC status code that a service answers with.

    from omru import errors

    try:
        c.cancel("nosuch")
    except errors.NotFound as exc:
        print(exc.code().name, exc.details())   # NOT_FOUND job_id 'nosuch' not found

Every error is an `OmruError`; each keeps the status code (`code()`, a
``grpc.StatusCode``) and the service's own words (`details()`), and names the
address it called (`address`). `OmruError` derives from ``grpc.RpcError`` so
that code written against the raw gRPC errors keeps working; `InvalidArgument`
is also a ``ValueError`` (the SDK raises it for bad input it finds itself,
naming the bad value, before anything is sent). `WaitTimeout` (a
`DeadlineExceeded`) is what `wait` raises when its time is up; it carries the
jobs' last known states.
"""

from __future__ import annotations

import grpc


class OmruError(grpc.RpcError):
    """A call the service refused or could not answer (base of the SDK's errors)."""

    status = grpc.StatusCode.UNKNOWN  # the code of the class; an instance may carry another (`code()`)

    def __init__(self, details: str, code: grpc.StatusCode | None = None, address: str = "") -> None:
        super().__init__(details)
        self._code = code or self.status
        self._details = details
        self.address = address

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def __str__(self) -> str:  # (the class names the code: "omru.errors.NotFound: job_id 'x' not found (host:port)")
        return f"{self._details} ({self.address})" if self.address else self._details


class InvalidArgument(OmruError, ValueError):
    """A request with a bad value (the message names it)."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(OmruError):
    """An unknown job (or logs no node has)."""

    status = grpc.StatusCode.NOT_FOUND


class AlreadyExists(OmruError):
    status = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(OmruError):
    status = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(OmruError):
    """The token or certificate is not allowed to do this."""

    status = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(OmruError):
    """No token, or a wrong one."""

    status = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(OmruError):
    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(OmruError):
    """The service cannot be reached (nothing listening, a TLS handshake refused, a standby planner)."""

    status = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(OmruError):
    """No answer within the call's deadline."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(OmruError):
    status = grpc.StatusCode.CANCELLED


class Internal(OmruError):
    status = grpc.StatusCode.INTERNAL


class WaitTimeout(DeadlineExceeded):
    """`wait` ran out of time: ``states`` holds the last known state of each job waited for (a JobStatus,
    or None for a job not seen yet)."""

    def __init__(self, details: str, states: dict, address: str = "") -> None:
        super().__init__(details, address=address)
        self.states = states


_BY_CODE = {c.status: c for c in (InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, PermissionDenied,
                                  Unauthenticated, ResourceExhausted, Unavailable, DeadlineExceeded, Cancelled,
                                  Internal)}


def from_rpc(exc: grpc.RpcError, address: str = "") -> OmruError:
    """The SDK error of a gRPC error (an `OmruError` is returned as it is)."""
    if isinstance(exc, OmruError):
        return exc
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else "") or str(code.name)
    return _BY_CODE.get(code, OmruError)(details, code=code, address=address)


__all__ = ["OmruError", "InvalidArgument", "NotFound", "AlreadyExists", "FailedPrecondition", "PermissionDenied",
           "Unauthenticated", "ResourceExhausted", "Unavailable", "DeadlineExceeded", "Cancelled", "Internal",
           "WaitTimeout", "from_rpc"]
