"""One frozen, validated configuration dataclass per service.

Configuration is built at the entry point (`main()` of each server, `omru
up`) from arguments and the environment; nothing below reads the
environment. Every dataclass validates itself in `__post_init__` and raises
`ConfigError` naming the bad value.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

#: Environment variable holding the bearer token (read by entry points only): an admin user's.
TOKEN_ENV = "OMRU_AUTH_TOKEN"
#: Environment variable holding the token a service sends as itself (`omru up` sets it per service).
SERVICE_TOKEN_ENV = "OMRU_SERVICE_TOKEN"
#: Environment variable holding the password of the service's etcd user (`omru up` sets it per service).
ETCD_PASSWORD_ENV = "OMRU_ETCD_PASSWORD"
#: Environment variable listing, colon-separated, the folders a node's data sets may come from.
DATA_ROOTS_ENV = "OMRU_DATA_ROOTS"
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names it."""


def check_id(name: str, value: str) -> str:
    """Return value when it is a valid id ([A-Za-z0-9._-], 1..128 chars), else raise."""
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise ConfigError(f"{name} {value!r} is not a valid id ([A-Za-z0-9._-], 1..128 characters)")
    return value


def check_token(name: str, value: str | None) -> None:
    """A bearer token (None: none): ConfigError unless non-empty and free of whitespace."""
    if value is not None and (not value or any(c.isspace() for c in value)):
        raise ConfigError(f"{name} is empty or contains whitespace")


def check_endpoint(name: str, value: str) -> str:
    """Return value when it is "host:port" with a port in 0..65535, else raise."""
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name} {value!r} is not host:port")
    return value


def default_checkpoint_root() -> Path:
    """The checkpoint root when none is configured: <tmp>/omru-checkpoints (the planner's default too)."""
    return Path(tempfile.gettempdir()) / "omru-checkpoints"


def split_roots(text: str) -> tuple[str, ...]:
    """"/a:/b" -> ("/a", "/b"): the folders of a colon-separated list (empty entries dropped)."""
    return tuple(p for p in text.split(os.pathsep) if p)


def _real_folder(name: str, value) -> Path:
    """value with '..' and symlinks resolved (os.path.realpath); ConfigError unless an absolute path."""
    if not isinstance(value, (str, os.PathLike)) or not os.path.isabs(value):
        raise ConfigError(f"{name} {str(value)!r} is not an absolute path")
    return Path(os.path.realpath(value))


#: Identity (certificate CN and DNS SAN, see deploy/make-certs.sh) of the registry.
REGISTRY_IDENTITY = "omru-registry"


@dataclass(frozen=True)
class TlsConfig:
    """TLS from PEM files: an own certificate and key (both or neither) and a CA bundle.

    As a server: cert/key are served; with ca_file, clients must present a
    certificate the CA signed (mutual TLS). As a client: ca_file verifies the
    server (None: the system roots); cert/key, when given, are presented."""

    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError("tls cert_file and key_file must be given together")
        if self.cert_file is None and self.ca_file is None:
            raise ConfigError("tls needs cert_file and key_file, or ca_file")
        for name in ("cert_file", "key_file", "ca_file"):
            value = getattr(self, name)
            if value is None:
                continue
            path = Path(value)
            if not path.is_file():
                raise ConfigError(f"tls {name} {str(path)!r} is not a readable file")
            object.__setattr__(self, name, path)

    @property
    def mutual(self) -> bool:
        """Own certificate and a CA: both ends verify each other."""
        return self.cert_file is not None and self.ca_file is not None


@dataclass(frozen=True)
class ServerConfig:
    """Where and how a gRPC server listens."""

    host: str = "127.0.0.1"
    port: int = 0
    tls: TlsConfig | None = None
    auth_token: str | None = None  # the single legacy token: an admin user's; sent unless service_token
    grace_seconds: float = 2.0
    metrics_port: int | None = None  # Prometheus /metrics on this port of host (0: any free port; None: off)
    tokens: Mapping[str, Any] = field(default_factory=dict)  # token -> authz.Principal (--auth-tokens)
    service_token: str | None = None  # the token this service sends as itself on its calls

    def __post_init__(self) -> None:
        if not self.host:
            raise ConfigError("host '' is empty")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port!r} is not in 0..65535")
        if self.metrics_port is not None and (not isinstance(self.metrics_port, int) or not 0 <= self.metrics_port <= 65535):
            raise ConfigError(f"--metrics-port {self.metrics_port!r} is not in 0..65535")
        if self.tls is not None and self.tls.cert_file is None:
            raise ConfigError("server tls needs a certificate and key (--tls-cert, --tls-key)")
        check_token("auth token", self.auth_token)
        check_token("service token", self.service_token)
        if self.grace_seconds < 0:
            raise ConfigError(f"grace_seconds {self.grace_seconds!r} is negative")

    @property
    def call_token(self) -> str | None:
        """The bearer token this service sends on its own calls: its own, else the legacy one."""
        return self.service_token or self.auth_token

    @property
    def client_tls(self) -> TlsConfig | None:
        """TLS of the channels this service opens to others: with mutual TLS its
        own certificate and the CA, else None (plaintext)."""
        return self.tls if self.tls is not None and self.tls.mutual else None


@dataclass(frozen=True)
class EtcdConfig:
    """How to reach etcd."""

    endpoint: str = "127.0.0.1:2379"
    prefix: str = "/omru/"
    timeout_seconds: float = 2.0
    tls: TlsConfig | None = None  # https to etcd (ca_file; cert/key for --client-cert-auth)
    user: str | None = None  # etcd's own authentication: this user, signed in with password (both or neither)
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_endpoint("etcd endpoint", self.endpoint)
        if (self.user is None) != (self.password is None):
            raise ConfigError("etcd user and password must be given together (--etcd-user, and "
                              f"--etcd-password-file or ${ETCD_PASSWORD_ENV})")
        if self.user is not None:
            check_id("etcd user", self.user)
            check_token("etcd password", self.password)
        if not self.prefix.startswith("/") or not self.prefix.endswith("/"):
            raise ConfigError(f"etcd prefix {self.prefix!r} must start and end with '/'")
        if not self.timeout_seconds > 0:
            raise ConfigError(f"etcd timeout_seconds {self.timeout_seconds!r} is not positive")
        if self.tls is not None and self.tls.ca_file is None:
            raise ConfigError("etcd tls needs the CA of etcd's certificate (--etcd-ca)")


@dataclass(frozen=True)
class RegistryConfig:
    """The registry service."""

    server: ServerConfig = field(default_factory=ServerConfig)
    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    max_ttl_seconds: int = 3600

    def __post_init__(self) -> None:
        if self.max_ttl_seconds < 1:
            raise ConfigError(f"max_ttl_seconds {self.max_ttl_seconds!r} is below 1")


@dataclass(frozen=True)
class ProfilerConfig:
    """The profiler service."""

    server: ServerConfig = field(default_factory=ServerConfig)
    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    registry: str = "127.0.0.1:0"

    def __post_init__(self) -> None:
        check_endpoint("registry address", self.registry)


@dataclass(frozen=True)
class PlannerConfig:
    """The planner service."""

    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=50051))
    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    registry: str = "127.0.0.1:0"
    profiler: str = "127.0.0.1:0"
    policy: str = ""  # "" = the planner's default policy
    checkpoint_root: str = ""  # folder every node sees; "" = <tmp>/omru-checkpoints (one machine only)
    start_overhead_s: float = 4.0  # prior of a start's (restart's) cost until one is measured
    time_scale: float = 1.0  # job seconds per wall second: > 1 only for an emulated cluster (omru emulate)
    leader_ttl_s: int = 15  # the leader's lease: a standby takes over within this and a poll after it dies
    trial_timeout_s: float = 600.0  # a profiling trial that runs longer is stopped
    checkpoint_retention_s: float = 7 * 86400.0  # an ended job's checkpoints are removed this long after its end

    def __post_init__(self) -> None:
        check_endpoint("registry address", self.registry)
        check_endpoint("profiler address", self.profiler)
        if not (isinstance(self.start_overhead_s, (int, float)) and 0 <= self.start_overhead_s < 1e6):
            raise ConfigError(f"start_overhead_s {self.start_overhead_s!r} is not in [0, 1e6)")
        if not isinstance(self.leader_ttl_s, int) or not 1 <= self.leader_ttl_s <= 3600:
            raise ConfigError(f"leader_ttl_s {self.leader_ttl_s!r} is not in 1..3600")
        if not (isinstance(self.time_scale, (int, float)) and 0 < self.time_scale <= 1e6):
            raise ConfigError(f"time_scale {self.time_scale!r} is not in (0, 1e6]")
        if not (isinstance(self.trial_timeout_s, (int, float)) and 1 <= self.trial_timeout_s <= 86400):
            raise ConfigError(f"trial_timeout_s {self.trial_timeout_s!r} is not in [1, 86400]")
        if not (isinstance(self.checkpoint_retention_s, (int, float)) and 0 <= self.checkpoint_retention_s <= 3.2e8):
            raise ConfigError(f"checkpoint_retention_s {self.checkpoint_retention_s!r} is not in [0, 3.2e8] (ten years)")


@dataclass(frozen=True)
class ExecutorConfig:
    """The executor of one node."""

    node_id: str
    server: ServerConfig = field(default_factory=ServerConfig)
    registry: str = "127.0.0.1:0"
    slots: int = 2
    ttl_seconds: int = 5
    advertise_host: str = ""
    work_dir: Path | None = None
    max_restarts: int = 2
    warm_workers: bool = True  # a worker with torch imported waits on each device (no import at job start)
    registry_identity: str = REGISTRY_IDENTITY  # with mutual TLS: whose allocations the node follows
    checkpoint_root: Path | None = None  # directives' checkpoint folders lie under it; None = default_checkpoint_root()
    data_roots: tuple[Path, ...] = ()  # imagefolder:/clips: folders lie under one; () = built-in data sets only

    def __post_init__(self) -> None:
        # both resolved once here: what directives name is resolved the same way and compared with these
        object.__setattr__(self, "checkpoint_root",
                           _real_folder("checkpoint_root", self.checkpoint_root or default_checkpoint_root()))
        object.__setattr__(self, "data_roots", tuple(_real_folder("data root", r) for r in self.data_roots))
        check_id("node_id", self.node_id)
        check_id("registry_identity", self.registry_identity)
        if not isinstance(self.max_restarts, int) or not 0 <= self.max_restarts <= 100:
            raise ConfigError(f"max_restarts {self.max_restarts!r} is not in 0..100")
        check_endpoint("registry address", self.registry)
        if not isinstance(self.slots, int) or not 1 <= self.slots <= 1024:
            raise ConfigError(f"slots {self.slots!r} is not in 1..1024")
        if not isinstance(self.ttl_seconds, int) or not 1 <= self.ttl_seconds <= 3600:
            raise ConfigError(f"ttl_seconds {self.ttl_seconds!r} is not in 1..3600")


# --- entry-point helpers: arguments + environment -> config -----------------


def add_server_args(parser: argparse.ArgumentParser, default_port: int = 0) -> None:
    """The listening options every server takes."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=default_port, help="port (0 = any free port)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus metrics (/metrics, HTTP; HTTPS with --tls-cert; the bearer token "
                             "when one is set) on this port of --host (0 = any free port; default: none)")
    add_tls_args(parser, "serve TLS", "require client certificates it signed and verify the services this "
                 "one calls (mutual TLS; they are called with --tls-cert)")
    parser.add_argument(
        "--auth-token-file",
        type=Path,
        help=f"file holding a bearer token accepted as an admin user's, and sent on this service's calls "
             f"unless it has its own (else ${TOKEN_ENV})",
    )
    parser.add_argument("--auth-tokens", type=Path,
                        help="file of the accepted bearer tokens, a line 'token name role' each (role: admin, user, "
                             "metrics (a scraper: /metrics only), or planner, registry, profiler, node for services; "
                             "a node's name is its node id)")
    parser.add_argument("--service-token-file", type=Path,
                        help=f"file holding the token this service sends as itself (else ${SERVICE_TOKEN_ENV})")


def add_tls_args(parser: argparse.ArgumentParser, cert_use: str, ca_use: str) -> None:
    """--tls-cert/--tls-key (own certificate) and --tls-ca (CA bundle)."""
    parser.add_argument("--tls-cert", type=Path, help=f"PEM certificate (with --tls-key: {cert_use})")
    parser.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    parser.add_argument("--tls-ca", type=Path, help=f"PEM CA bundle: {ca_use}")


def add_etcd_args(parser: argparse.ArgumentParser) -> None:
    """The etcd options of services that store state."""
    parser.add_argument("--etcd", default="127.0.0.1:2379", help="etcd endpoint host:port")
    parser.add_argument("--etcd-prefix", default="/omru/", help="key prefix of all OMRU keys")
    parser.add_argument("--etcd-ca", type=Path, help="PEM CA bundle of etcd's certificate (reach etcd over TLS)")
    parser.add_argument("--etcd-cert", type=Path, help="PEM client certificate for etcd (--client-cert-auth)")
    parser.add_argument("--etcd-key", type=Path, help="PEM private key of --etcd-cert")
    parser.add_argument("--etcd-user", help="etcd user this service signs in as (etcd's own authentication; "
                                            f"its password from --etcd-password-file, else ${ETCD_PASSWORD_ENV})")
    parser.add_argument("--etcd-password-file", type=Path, help="file holding the password of --etcd-user")


def tls_config(cert: Path | None, key: Path | None, ca: Path | None, flags: str = "--tls") -> TlsConfig | None:
    """TlsConfig from the three options (None when none is given); the error names the flag."""
    if cert is None and key is None and ca is None:
        return None
    if (cert is None) != (key is None):
        raise ConfigError(f"{flags}-cert and {flags}-key must be given together")
    for suffix, path in (("cert", cert), ("key", key), ("ca", ca)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{flags}-{suffix} {str(path)!r} is not a readable file")
    return TlsConfig(cert, key, ca)


def read_token(args: argparse.Namespace, env: Mapping[str, str], option: str = "auth_token_file",
               variable: str = TOKEN_ENV) -> str | None:
    """The bearer token: --auth-token-file, else $OMRU_AUTH_TOKEN, else None (or another option and variable)."""
    path = getattr(args, option, None)
    if path is not None:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{option.replace('_', ' ')} {str(path)!r} cannot be read: {exc.strerror}") from exc
    return env.get(variable) or None


def server_config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> ServerConfig:
    """ServerConfig from add_server_args options and the environment."""
    from services.common.authz import read_tokens

    tls = tls_config(args.tls_cert, args.tls_key, args.tls_ca)
    tokens = read_tokens(args.auth_tokens) if getattr(args, "auth_tokens", None) is not None else {}
    return ServerConfig(host=args.host, port=args.port, tls=tls, auth_token=read_token(args, env),
                        metrics_port=getattr(args, "metrics_port", None), tokens=tokens,
                        service_token=read_token(args, env, "service_token_file", SERVICE_TOKEN_ENV))


def etcd_config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> EtcdConfig:
    """EtcdConfig from add_etcd_args options and the environment (the etcd password)."""
    tls = tls_config(args.etcd_cert, args.etcd_key, args.etcd_ca, "--etcd")
    password = read_token(args, env, "etcd_password_file", ETCD_PASSWORD_ENV)
    if args.etcd_user is None and password is not None and args.etcd_password_file is None:
        password = None  # a stray $OMRU_ETCD_PASSWORD without --etcd-user: no etcd user asked for
    return EtcdConfig(endpoint=args.etcd, prefix=args.etcd_prefix, tls=tls, user=args.etcd_user, password=password)
