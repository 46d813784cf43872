"""Who may call what: principals, the tokens file, the one table, the one interceptor.

A caller is a `Principal`: a user (role user or admin), a service (planner,
registry, profiler) or the executor of one node. It is named by

- its certificate under mutual TLS: CN omru-planner, omru-registry,
  omru-profiler, omru-executor-<node> (deploy/make-certs.sh; a node's
  certificate acts for that node only, and no certificate acts for every
  node);
- else its bearer token: the tokens file (`read_tokens`, lines
  "token name role") or the single legacy token (--auth-token-file,
  $OMRU_AUTH_TOKEN), which is an admin user's ("admin").

`TABLE` says, per service and RPC, which kinds of principal may call it;
`AuthzInterceptor` enforces it on every server: no credential or an unknown
token is UNAUTHENTICATED, a principal the row does not name is
PERMISSION_DENIED (naming the method and the principal). Health is open.
With no token configured and no mutual TLS, every caller may call
everything (a single-user machine); under mutual TLS a certificate naming
no service or node (a user's, omru-client) needs a token like any other
caller, so a server given no token (a GPU node's executor) answers only the
services and nodes. What depends on a
job (cancel, logs: the owner or an admin) is checked by the planner with
`caller()` and `may_act_on`.
"""

from __future__ import annotations

import contextvars
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import grpc

from services.common.config import ConfigError, check_id

ADMIN, USER, PLANNER, REGISTRY, PROFILER, NODE = "admin", "user", "planner", "registry", "profiler", "node"
METRICS = "metrics"  # a scraper (Prometheus): reads /metrics, calls no RPC
ANYONE = "anyone"  # auth off: a caller that may call everything
#: Roles a tokens file may give (services get a token under `omru up`; a node's name is its node id).
ROLES = (ADMIN, USER, PLANNER, REGISTRY, PROFILER, NODE, METRICS)
#: In a row: the node the request's node_id names (a node only for itself).
THIS_NODE = "this node"


@dataclass(frozen=True)
class Principal:
    kind: str  # one of ROLES, or ANYONE
    name: str  # user name, service name, or node id

    def __str__(self) -> str:
        if self.kind in (USER, ADMIN):
            return f"{self.kind} {self.name!r}"
        if self.kind == NODE:
            return f"node {self.name!r}"
        return self.kind


OPEN = Principal(ANYONE, "")
LEGACY_ADMIN = "admin"  # the name of the single legacy token's user

USERS = (USER, ADMIN)
EVERYONE = (ADMIN, USER, PLANNER, REGISTRY, PROFILER, NODE)  # every caller of RPCs (a scraper is none)
#: Who may read a service's /metrics (services/common/metrics.py): the one row outside gRPC.
METRICS_READERS = (ADMIN, METRICS)

#: service -> RPC -> who may call it. THIS_NODE: a node, for the node_id the request names.
TABLE: dict[str, dict[str, tuple[str, ...]]] = {
    "omru.v1.RegistryService": {
        "RegisterNode": (THIS_NODE, PLANNER),
        "KeepAliveNode": (THIS_NODE, PLANNER),
        "DeregisterNode": (THIS_NODE, PLANNER, ADMIN),
        "WatchAllocations": (THIS_NODE, PLANNER),
        "GetNode": EVERYONE,
        "ListNodes": EVERYONE,
        "ListClaims": EVERYONE,
        "WatchCluster": EVERYONE,
    },
    "omru.v1.ExecutorService": {
        "GetJobs": (PLANNER, ADMIN),
        "WatchEvents": (PLANNER, ADMIN),
        "GetLogs": (PLANNER, ADMIN),
    },
    "omru.v1.PlannerService": {
        "SubmitJobs": USERS,
        "CancelJob": USERS,  # a user only its own jobs (the planner checks the owner)
        "GetJobLogs": USERS,  # likewise
        "GetPlan": USERS,
        "WatchJobs": USERS,
        "ListJobs": USERS,
        "GetReport": USERS,
        "RunTrial": (PROFILER,),
    },
    "omru.v1.ProfilerService": {
        "Profile": (USER, ADMIN, PLANNER),
        "GetProfile": (USER, ADMIN, PLANNER),
    },
    "grpc.reflection.v1alpha.ServerReflection": {"ServerReflectionInfo": EVERYONE},
}
#: Services every caller reaches without a credential (load balancers and probes).
PUBLIC = ("grpc.health.v1.Health",)

#: Certificate common names of the services (deploy/make-certs.sh).
SERVICE_CNS = {"omru-planner": PLANNER, "omru-registry": REGISTRY, "omru-profiler": PROFILER}
NODE_CN_PREFIX = "omru-executor-"


def allowed(method: str) -> tuple[str, ...] | None:
    """The row of a full method name ("/omru.v1.PlannerService/CancelJob"); None when the table lacks it."""
    service, _, rpc = method.strip("/").partition("/")
    return TABLE.get(service, {}).get(rpc)


def permits(row: tuple[str, ...], p: Principal, node_id: str | None = None) -> bool:
    """Whether p may make a call of the row (node_id: the node the request names, where it names one)."""
    if p.kind == ANYONE or p.kind in row:
        return True
    return THIS_NODE in row and p.kind == NODE and node_id is not None and node_id == p.name


def may_act_on(p: Principal, owner: str) -> bool:
    """Whether p may cancel (or read the logs of) a job of owner: its owner or an admin (a job stored
    without an owner: admins only)."""
    return p.kind in (ANYONE, ADMIN) or (p.kind == USER and bool(owner) and owner == p.name)


_caller: contextvars.ContextVar[Principal] = contextvars.ContextVar("omru_caller", default=OPEN)


def caller() -> Principal:
    """The principal of the call being served (OPEN outside a call, or without auth)."""
    return _caller.get()


def owner_of(p: Principal) -> str:
    """The owner a job submitted by p records ("" without auth)."""
    return p.name if p.kind in USERS else ""


# --- tokens -----------------------------------------------------------------


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse_tokens(text: str, source: str) -> dict[str, Principal]:
    """token -> principal from lines "token name role" (# comments and blank lines skipped).

    ConfigError names the line and the bad value (never a token)."""
    tokens: dict[str, Principal] = {}
    user_roles: dict[str, str] = {}  # a user's tokens (several: rotation) give it one role
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source} line {number}"
        if len(words) != 3:
            raise ConfigError(f"{where}: expected 'token name role', got {len(words)} fields")
        token, name, role = words
        if role not in ROLES:
            raise ConfigError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
        try:
            check_id("name", name)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if role in (PLANNER, REGISTRY, PROFILER) and name != role:
            raise ConfigError(f"{where}: a {role} token's name must be {role!r}, not {name!r}")
        if token in tokens:
            raise ConfigError(f"{where}: this token is given twice")
        if role in USERS and user_roles.setdefault(name, role) != role:
            raise ConfigError(f"{where}: user {name!r} has role {user_roles[name]!r} on an earlier line, not {role!r}")
        tokens[token] = Principal(role, name)
    if not tokens:
        raise ConfigError(f"{source} names no token")
    return tokens


def read_tokens(path: Path) -> dict[str, Principal]:
    """The tokens file at path (see parse_tokens)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"auth tokens file {str(path)!r} cannot be read: {getattr(exc, 'strerror', exc)}") from exc
    return parse_tokens(text, f"auth tokens file {str(path)!r}")


def format_tokens(tokens: Mapping[str, Principal]) -> str:
    """The tokens file's text of token -> principal."""
    return "".join(f"{t} {p.name} {p.kind}\n" for t, p in tokens.items())


# --- the interceptor -------------------------------------------------------------


class Authenticator:
    """Names the principal of a call from its peer certificate and bearer token."""

    def __init__(self, tokens: Mapping[str, Principal] = {}, legacy_token: str | None = None,
                 mutual_tls: bool = False) -> None:
        self._by_digest = {_digest(t): p for t, p in tokens.items()}
        if legacy_token:
            self._by_digest.setdefault(_digest(legacy_token), Principal(ADMIN, LEGACY_ADMIN))
        # without tokens and without mutual TLS, a caller is OPEN; with either, it must be named
        self.enforcing = bool(self._by_digest) or mutual_tls

    def principal(self, metadata, auth_context: Mapping) -> Principal | str:
        """The caller's principal, or why there is none ("missing", "wrong")."""
        cns = auth_context.get("x509_common_name") or ()
        cn = cns[0].decode(errors="replace") if cns else ""
        if cn in SERVICE_CNS:
            return Principal(SERVICE_CNS[cn], SERVICE_CNS[cn])
        if cn.startswith(NODE_CN_PREFIX) and len(cn) > len(NODE_CN_PREFIX):
            return Principal(NODE, cn[len(NODE_CN_PREFIX):])
        sent = dict(metadata or ()).get("authorization", "")
        if isinstance(sent, bytes):
            sent = sent.decode(errors="replace")
        if sent:
            scheme, _, token = sent.partition(" ")
            p = self._by_digest.get(_digest(token.strip())) if scheme.lower() == "bearer" else None
            return p if p is not None else "wrong"
        return "missing" if self.enforcing else OPEN


_KINDS = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


class AuthzInterceptor(grpc.aio.ServerInterceptor):
    """Every call but health's: its principal (UNAUTHENTICATED without one), then the TABLE's row
    (PERMISSION_DENIED naming method and principal; a method the table lacks is denied to every
    principal). The principal is `caller()` while the call is served."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.strip("/").partition("/")[0] in PUBLIC:
            return handler
        attribute, make = _KINDS[(handler.request_streaming, handler.response_streaming)]
        behavior = getattr(handler, attribute)
        row = allowed(method)
        check = self._check

        if handler.response_streaming:
            async def wrapped(request, context):
                await check(method, row, request, context)
                result = behavior(request, context)
                if hasattr(result, "__aiter__"):
                    async for item in result:
                        yield item
                else:
                    await result
        else:
            async def wrapped(request, context):
                await check(method, row, request, context)
                return await behavior(request, context)

        return make(wrapped, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

    async def _check(self, method: str, row, request, context) -> None:
        p = self.authenticator.principal(context.invocation_metadata(), context.auth_context())
        if isinstance(p, str):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                f"{method}: {p} bearer token (send metadata 'authorization: Bearer <token>')")
        node_id = getattr(request, "node_id", None)
        if row is None or not permits(row, p, node_id):
            who = ", ".join(row) if row else "nobody (not in the authorization table)"
            if row and THIS_NODE in row and p.kind == NODE:
                why = f"a node acts only for itself, and this call names node {node_id!r}"
            else:
                why = f"allowed: {who}"
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method}: {p} may not call it ({why})")
        _caller.set(p)
