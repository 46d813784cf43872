"""The context file: where the cluster `omru up` started is, for every command and the SDK.

`omru up` writes it once its cluster is ready and removes it when it stops
(only while the file still names its own process); `omru down` reads it to
stop that cluster. It lives at ``$OMRU_CONTEXT``, else
``$XDG_CONFIG_HOME/omru/context.json``, else ``~/.config/omru/context.json``;
it is written atomically (a temp file renamed over it) with mode 0600, since it
may hold the bearer token.

Format (JSON object, version 1; unknown keys are ignored, so older readers
read newer files)::

    {"version": 1,
     "planner": "127.0.0.1:50051", "registry": "...", "profiler": "...", "etcd": "...",
     "executors": ["..."], "metrics": {"planner": "127.0.0.1:...", ...},
     "token": null, "tls_ca": null, "tls_cert": null, "tls_key": null,
     "pid": 1234, "started": "1234:98765", "started_unix_s": 1765000000.0,
     "work_dir": "/tmp/omru-...", "log": "/home/u/.config/omru/up.log"}

``pid`` is the `omru up` process; ``started`` its identity (pid and the
kernel's start time of that process), so a pid reused by another process is
not mistaken for it. Addresses resolve as flag > environment > context >
default (`resolve`); the context's token and TLS files are used only for an
address the context names, so they are never sent to another server.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

VERSION = 1
ENV = "OMRU_CONTEXT"
#: Environment variables of the addresses, by service.
ADDRESS_ENV = {"planner": "OMRU_PLANNER", "registry": "OMRU_REGISTRY", "profiler": "OMRU_PROFILER"}
TOKEN_ENV = "OMRU_AUTH_TOKEN"
TLS_ENV = {"tls_ca": "OMRU_TLS_CA", "tls_cert": "OMRU_TLS_CERT", "tls_key": "OMRU_TLS_KEY"}
DEFAULT_PLANNER = "127.0.0.1:50051"


class ContextError(Exception):
    """A context file that cannot be read (not JSON, not an object, a bad field)."""


@dataclass
class Context:
    planner: str = ""
    registry: str = ""
    profiler: str = ""
    etcd: str = ""
    executors: list[str] = field(default_factory=list)
    metrics: dict[str, str] = field(default_factory=dict)
    token: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    pid: int = 0
    started: str = ""
    started_unix_s: float = 0.0
    work_dir: str = ""
    log: str = ""
    version: int = VERSION

    def addresses(self) -> set[str]:
        return {a for a in (self.planner, self.registry, self.profiler, *self.executors) if a}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def path() -> Path:
    """Where the context file is (it need not exist)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "omru" / "context.json"


def load(where: Path | None = None) -> Context | None:
    """The context at `where` (default `path()`), None when there is none; ContextError when unreadable."""
    where = where or path()
    try:
        text = where.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ContextError(f"context {str(where)!r} cannot be read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContextError(f"context {str(where)!r} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ContextError(f"context {str(where)!r} is not a JSON object")
    known = {f.name: f for f in fields(Context)}
    values = {k: v for k, v in data.items() if k in known}
    for name in ("planner", "registry", "profiler", "etcd", "started", "work_dir", "log"):
        if not isinstance(values.get(name, ""), str):
            raise ContextError(f"context {str(where)!r}: {name} is not a string")
    for name in ("token", "tls_ca", "tls_cert", "tls_key"):
        if values.get(name) is not None and not isinstance(values[name], str):
            raise ContextError(f"context {str(where)!r}: {name} is not a string")
    if not isinstance(values.get("pid", 0), int):
        raise ContextError(f"context {str(where)!r}: pid is not an integer")
    return Context(**values)


def write(ctx: Context, where: Path | None = None) -> Path:
    """Write ctx atomically with mode 0600 (its folder created 0700); returns the path."""
    where = where or path()
    where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".context-", suffix=".tmp", dir=where.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as out:
            out.write(ctx.to_json())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, where)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return where


def remove_if_own(started: str, where: Path | None = None) -> bool:
    """Remove the context if it still names the process `started` identifies (True when removed)."""
    where = where or path()
    try:
        ctx = load(where)
    except ContextError:
        return False
    if ctx is None or ctx.started != started:
        return False
    try:
        where.unlink()
    except FileNotFoundError:
        return False
    return True


def process_identity(pid: int) -> str:
    """"pid:start-ticks" (Linux /proc), else "pid:"; '' when no such process lives."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    except OSError:
        return f"{pid}:"
    rest = stat.rsplit(")", 1)[1].split()
    if rest[0] == "Z":  # exited, not yet reaped
        return ""
    return f"{pid}:{rest[19]}"  # field 22, starttime


def alive(ctx: Context) -> bool:
    """Whether the `omru up` process the context names still runs (the same process, not a reused pid)."""
    if ctx.pid <= 0:
        return False
    if Path("/proc").is_dir():
        now = process_identity(ctx.pid)
        return bool(now) and (not ctx.started or now == ctx.started or ctx.started.endswith(":"))
    try:
        os.kill(ctx.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Connection:
    """Where to reach one service and how: the address, where it came from, token and TLS paths."""

    service: str
    address: str | None
    source: str  # "flag", "env", "context", "default" or "none"
    token: str | None
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    context_path: Path | None = None


def resolve(service: str, address: str | None = None, token: str | None = None, tls: dict | None = None,
            default: str | None = None, ctx: Context | None | bool = True) -> Connection:
    """The connection to `service` ("planner", "registry", "profiler"): flag > env > context > default.

    address/token/tls are what the caller was given explicitly (flags or
    arguments); tls maps tls_ca/tls_cert/tls_key to paths. ctx: a Context,
    None (no context), or True to load `path()`. The context's token and TLS
    paths fill what neither flag nor environment gave, and only when the
    address is one the context names."""
    tls = dict(tls or {})
    where = path()
    if ctx is True:
        ctx = load(where)
    env_address = os.environ.get(ADDRESS_ENV.get(service, ""), "") if service in ADDRESS_ENV else ""
    ctx_address = getattr(ctx, service, "") if ctx is not None else ""
    if address:
        chosen, source = address, "flag"
    elif env_address:
        chosen, source = env_address, "env"
    elif ctx_address:
        chosen, source = ctx_address, "context"
    elif default:
        chosen, source = default, "default"
    else:
        chosen, source = None, "none"
    own = ctx is not None and chosen is not None and chosen in ctx.addresses()
    token = token or os.environ.get(TOKEN_ENV) or (ctx.token if own else None) or None
    paths = {}
    for key, env in TLS_ENV.items():
        value = tls.get(key) or os.environ.get(env) or (getattr(ctx, key) if own else None)
        paths[key] = str(value) if value else None
    return Connection(service, chosen, source, token, paths["tls_ca"], paths["tls_cert"], paths["tls_key"],
                      where if ctx is not None else None)


__all__ = ["Context", "ContextError", "Connection", "path", "load", "write", "remove_if_own", "process_identity",
           "alive", "resolve", "DEFAULT_PLANNER"]
