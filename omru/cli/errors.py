"""Errors of the command line and their exit codes, in one place (`run` wraps every command).

Exit codes: 0 done; 1 the work failed (a job, a profile, a cluster that gave
up); 2 a usage error (bad flag, bad file, a request the service refused as
invalid); 3 nothing to talk to (a service cannot be reached, no cluster
running, no address known); 130 interrupted.

(A module of its own, so `python -m omru.cli.main` and `omru.cli.main` share
one class.)
"""

from __future__ import annotations

import os
import sys

USAGE = 2
UNREACHABLE = 3


class CliError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class Unreachable(Exception):
    """A service cannot be reached, or no cluster is known: printed as one line, exit code 3."""


#: The service the command talks to now: (name, address, where the address came from, speaks TLS).
_target: tuple[str, str, str, bool] | None = None


def note_target(service: str, address: str, source: str = "", tls: bool = False) -> None:
    """Remember what the command is about to call, so an UNAVAILABLE can name it."""
    global _target
    _target = (service, address, source, tls)


def hint(service: str, source: str = "") -> str:
    """What to do when `service` cannot be reached (source: where its address came from)."""
    flag = {"planner": "--planner / $OMRU_PLANNER", "registry": "--registry / $OMRU_REGISTRY",
            "profiler": "--profiler / $OMRU_PROFILER"}.get(service, "its address")
    if source == "context":
        from omru import context

        return (f"the context {context.path()} names it: is its cluster still running? "
                f"`omru down` clears it; start one with `omru up`, or set {flag}")
    return f"no cluster running? start one with `omru up`, or set {flag}"


def unreachable(service: str, address: str, source: str = "", details: str = "") -> Unreachable:
    """The Unreachable of a failed connection (details: the service's own words when they say more)."""
    text = f"cannot reach the {service} at {address}"
    if details:
        text = f"the {service} at {address} is unavailable: {details}"
    return Unreachable(f"{text} ({hint(service, source)})")


#: What gRPC says when it never got a connection (as opposed to a service's own UNAVAILABLE message).
_CONNECT_FAILED = ("failed to connect", "connections to all backends failing", "dns resolution failed",
                   "name resolution", "connect failed", "socket closed", "connection refused")


def from_rpc(exc, service: str | None = None, address: str | None = None, source: str = "",
             tls: bool | None = None) -> Exception | None:
    """The Unreachable of an RpcError that means the service is not there (UNAVAILABLE, or no answer
    in time), else None.

    Nothing listening (connection refused): the plain one line with the hint. A connection that
    failed otherwise (closed, reset, a TLS handshake refused: TLS in use or named) keeps gRPC's last
    error in brackets, since then the address is right and the cause is what helps. A service's own
    UNAVAILABLE (a standby planner naming the leader) is quoted."""
    import grpc

    code = exc.code() if hasattr(exc, "code") else None
    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return None
    noted = _target or ("service", "its address", "", False)
    if service is None or address is None:
        service, address, source = noted[:3]
    if tls is None:
        tls = noted[3] if (noted[0], noted[1]) == (service, address) else False
    details = " ".join(((exc.details() or "") if hasattr(exc, "details") else "").split())
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Unreachable(f"the {service} at {address} did not answer in time ({hint(service, source)})")
    low = details.lower()
    if not details or "connection refused" in low:
        return unreachable(service, address, source)
    if any(g in low for g in _CONNECT_FAILED):
        cause = details.split("last error:")[-1].strip()[:300]
        if tls or any(w in low for w in ("ssl", "tls", "handshake", "certificate")):
            return Unreachable(f"cannot reach the {service} at {address}: the connection failed, perhaps in the TLS "
                               f"handshake (check --tls-ca, --tls-cert, --tls-key or $OMRU_TLS_*) [{cause}]")
        return Unreachable(f"cannot reach the {service} at {address} ({hint(service, source)}) [{cause}]")
    return unreachable(service, address, source, details[:300])


def run(command: str, func, args) -> int:
    """Run one command's handler; map every error to its one line on stderr and its exit code."""
    try:
        return int(func(args) or 0)
    except CliError as exc:
        print(f"omru {command}: error: {exc}", file=sys.stderr)
        return USAGE
    except Unreachable as exc:
        print(f"omru: {exc}", file=sys.stderr)
        return UNREACHABLE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `omru ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        grpc = sys.modules.get("grpc")  # (imported by whatever raised it; the SDK's errors are RpcErrors too)
        if grpc is not None and isinstance(exc, grpc.RpcError):
            mapped = from_rpc(exc)
            if mapped is not None:
                print(f"omru: {mapped}", file=sys.stderr)
                return UNREACHABLE
        raise
