"""Launch a local OMRU cluster from child processes (what `omru up`, `omru
demo` and end-to-end tests use).

`EtcdProcess` runs Debian's `etcd` on free loopback ports with its own data
directory (restartable on the same ports and data). `ServiceProcess` runs
one `python -m services.<svc>.server` and waits for its JSON ready line.
`LocalCluster` starts etcd (unless an endpoint is given), the registry, then
the profiler, planner and N executors in parallel (planner and executors
with the same checkpoint root, <work_dir>/checkpoints), and stops all of them
(process groups, SIGTERM then SIGKILL) on exit; with die_with_parent,
children also get SIGTERM when the launcher dies (Linux parent-death signal).
With auth (users' tokens), a LocalCluster that starts etcd locks it (etcd's own
authentication): the registry, profiler and planner sign in as etcd users of
their own with passwords generated for the run; nobody else gets in.
`Supervisor` (what `LocalCluster.supervise`, i.e. `omru up`, runs) restarts a
child that exits, on the same argv, port and log file, with a doubling
backoff and a `RestartPolicy` limit past which it gives up.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import secrets
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Mapping, Sequence

from services.common.config import ETCD_PASSWORD_ENV, SERVICE_TOKEN_ENV, TOKEN_ENV, check_token

REPO_ROOT = Path(__file__).resolve().parents[2]


class LaunchError(RuntimeError):
    """A child process did not become ready; the message says which and why."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on host right now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


#: Writes etcd takes in one transaction (its default, 128, is less than a wide job's GPU claims).
ETCD_MAX_TXN_OPS = 4096
#: Environment flag: a service child asks the kernel for SIGTERM when its parent dies.
DIE_WITH_PARENT_ENV = "OMRU_DIE_WITH_PARENT"


def die_with_parent() -> None:
    """Called by a service at start (when $OMRU_DIE_WITH_PARENT=1): SIGTERM when the launcher dies (Linux).

    Done in the child itself, never in a preexec_fn: forking a process that
    runs gRPC threads and then running Python before exec can crash."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _pdeathsig_prefix() -> list[str]:
    """`setpriv --pdeathsig TERM --` for non-Python children, when util-linux has it."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


def _stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the child's process group, SIGKILL what is left after grace seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group (workers)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group and reap the child."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class EtcdProcess:
    """One etcd member with its own data directory: on free loopback ports by default.

    host, client_port and peer_port fix where it listens; prefix is put in
    front of its command (``ip netns exec NS`` runs it in a network
    namespace); health_endpoint is where this process reaches its client port
    when that is not the endpoint itself (a forwarder into the namespace)."""

    def __init__(self, data_dir: Path, binary: str = "etcd", log_file: Path | None = None, die_with_parent: bool = False,
                 host: str = "127.0.0.1", client_port: int = 0, peer_port: int = 0, prefix: Sequence[str] = (),
                 health_endpoint: str = "") -> None:
        self.data_dir = Path(data_dir)
        self.die_with_parent = die_with_parent
        self.binary = binary
        self.log_file = log_file
        self.host = host
        self.client_port = client_port
        self.peer_port = peer_port
        self.prefix = list(prefix)
        self.health_endpoint = health_endpoint
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def start(self, timeout: float = 10.0) -> "EtcdProcess":
        """Start on its ports (free ones chosen at the first start unless given; the same after a stop)."""
        if shutil.which(self.binary) is None:
            raise LaunchError(f"etcd binary {self.binary!r} not found (Debian: apt-get install etcd-server)")
        fresh = not self.client_port
        for attempt in range(3):
            if fresh:
                self.client_port, self.peer_port = free_port(), free_port()
            client, peer = f"http://{self.host}:{self.client_port}", f"http://{self.host}:{self.peer_port}"
            out: IO | int = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
            try:
                self.proc = subprocess.Popen(
                    [
                        *self.prefix, *(_pdeathsig_prefix() if self.die_with_parent else []),
                        self.binary, "--name", "omru", "--data-dir", str(self.data_dir),
                        "--listen-client-urls", client, "--advertise-client-urls", client,
                        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                        "--initial-cluster", f"omru={peer}", "--log-level", "warn", "--logger", "zap",
                        "--max-txn-ops", str(ETCD_MAX_TXN_OPS),
                    ],
                    stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
                )
            finally:
                if self.log_file:
                    out.close()
            if self._wait_healthy(timeout):
                return self
            code = self.proc.poll()
            self.stop()
            if not fresh:
                break
        raise LaunchError(f"etcd did not become healthy on {self.endpoint} (exit code {code})\n{_tail(self.log_file)}")

    def _wait_healthy(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(f"http://{self.health_endpoint or self.endpoint}/health", timeout=1) as reply:
                    if json.loads(reply.read()).get("health") == "true":
                        return True
            time.sleep(0.03)
        return False

    def stop(self, grace: float = 5.0) -> None:
        """Stop etcd (data and ports are kept for a restart)."""
        if self.proc is not None:
            _stop_group(self.proc, grace)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL etcd (as if the machine died)."""
        if self.proc is not None:
            _kill_group(self.proc)
            self.proc = None

    def restart(self, timeout: float = 10.0) -> None:
        """Stop, then start on the same ports with the same data."""
        self.stop()
        self.start(timeout)


@dataclass
class ServiceProcess:
    """One service child process and what its ready line said."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_file: Path | None = None
    proc: subprocess.Popen | None = None
    info: dict = field(default_factory=dict)
    _unread: bytes = field(default=b"", repr=False)  # stdout after the last newline (poll_ready)

    @property
    def address(self) -> str:
        return self.info["address"]

    def respawn(self) -> "ServiceProcess":
        """Start again after an exit: the same argv (a ``--port 0`` pinned to the port its
        ready line named, so its address stays the same), env and log file (appended to).

        The old process group is reaped (and stragglers in it killed) first; info
        keeps the old ready line until poll_ready reads the new one."""
        self.argv = pin_port(self.argv, self.info)
        self.stop(grace=0.0)
        self._unread = b""
        return self.spawn()

    def poll_ready(self) -> bool:
        """Read what the child printed so far, never blocking; True once its ready line came (then in info)."""
        if self.proc is None or self.proc.stdout is None:
            return False
        fd = self.proc.stdout.fileno()
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                return False
            *lines, self._unread = (self._unread + chunk).split(b"\n")
            for line in lines:
                with contextlib.suppress(ValueError):
                    msg = json.loads(line)
                    if isinstance(msg, dict) and msg.get("ready"):
                        self.info = msg
                        return True
        return False

    def spawn(self) -> "ServiceProcess":
        err: IO | None = open(self.log_file, "ab") if self.log_file else None
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=self.env,
                cwd=REPO_ROOT, start_new_session=True,
            )
        finally:
            if err:
                err.close()
        return self

    def stop(self, grace: float = 5.0) -> None:
        if self.proc is not None:
            _stop_group(self.proc, grace)
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None

    def kill(self) -> None:
        """SIGKILL the whole process group (no clean shutdown: leases are not revoked)."""
        if self.proc is not None:
            _kill_group(self.proc)
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None


def wait_ready(services: Sequence[ServiceProcess], timeout: float) -> None:
    """Wait until every service printed its ready line; LaunchError naming the first that fails."""
    selector = selectors.DefaultSelector()
    buffers: dict[int, bytes] = {}
    pending = {s.proc.stdout.fileno(): s for s in services}
    for fd in pending:
        selector.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                s = next(iter(pending.values()))
                raise LaunchError(f"{s.name} not ready within {timeout:.0f} s\n{_tail(s.log_file)}")
            for key, _ in selector.select(min(left, 0.5)):
                s = pending[key.fd]
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    s.proc.wait(5)
                    raise LaunchError(f"{s.name} exited with code {s.proc.returncode} before ready\n{_tail(s.log_file)}")
                buffers[key.fd] = buffers.get(key.fd, b"") + chunk
                for line in buffers[key.fd].split(b"\n")[:-1]:
                    with contextlib.suppress(ValueError):
                        msg = json.loads(line)
                        if isinstance(msg, dict) and msg.get("ready"):
                            s.info = msg
                if s.info:
                    selector.unregister(key.fd)
                    del pending[key.fd]
    finally:
        selector.close()


def pin_port(argv: Sequence[str], info: Mapping) -> list[str]:
    """argv with a ``--port 0`` replaced by the port a ready line (info) reports, and a
    ``--metrics-port 0`` by its metrics port; otherwise unchanged."""
    argv = list(argv)
    port = info.get("port") or str(info.get("address", "")).rpartition(":")[2]
    metrics_port = str(info.get("metrics") or "").rpartition(":")[2]
    for i, arg in enumerate(argv[:-1]):
        for flag, bound in (("--port", port), ("--metrics-port", metrics_port)):
            if arg == flag and argv[i + 1] == "0" and str(bound).isdigit() and int(bound) > 0:
                argv[i + 1] = str(bound)
    return argv


@dataclass(frozen=True)
class RestartPolicy:
    """When a supervisor restarts a child that exited.

    After the k-th restart within window_s (k = 0, 1, ...) the next waits
    backoff_s * 2**k, at most max_backoff_s; a child that exits when it was
    restarted max_restarts times within the last window_s is not restarted
    (the supervisor gives up: max_restarts 0 gives up at the first exit)."""

    max_restarts: int = 5
    window_s: float = 60.0
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def recent(self, restarts: Sequence[float], now: float) -> int:
        """How many of the restart times fall within window_s before now."""
        return sum(1 for t in restarts if now - t < self.window_s)

    def delay(self, recent: int) -> float:
        """Seconds to wait before a restart, given the restarts within the window so far."""
        return min(self.backoff_s * 2 ** recent, self.max_backoff_s)


@dataclass
class _Watched:
    """What a Supervisor knows of one child."""

    name: str
    child: "ServiceProcess | EtcdProcess"
    restarts: list[float] = field(default_factory=list)  # monotonic times of its restarts
    exit_code: int | None = None  # of its last exit (None: never exited, or not ready in time)
    due: float | None = None  # exited: when it is restarted
    ready_by: float | None = None  # restarted: deadline of its ready line


class Supervisor:
    """Restarts children that exit (ServiceProcesses and EtcdProcesses, by name) under a RestartPolicy.

    step() never blocks, except to restart etcd (until it is healthy, at most
    10 s); it returns the events of that look, one dict each:
    ``{"restarted": name, "exit_code": c, "restarts": n, "pid": p, "address": a}``
    once a restarted child is ready again, and, when a child exits past the
    limit (or is not ready ready_timeout seconds after a restart, which counts
    as an exit), ``{"ready": False, "exited": [names], "reason": "..."}``;
    after that the supervisor has given up and step() returns nothing."""

    def __init__(self, children: Mapping[str, "ServiceProcess | EtcdProcess"], policy: RestartPolicy | None = None,
                 ready_timeout: float = 30.0) -> None:
        self.policy = policy or RestartPolicy()
        self.ready_timeout = ready_timeout
        self.watched = [_Watched(name, child) for name, child in children.items()]
        self.given_up = False

    def restarts(self, name: str) -> int:
        """How many times the child called name was restarted."""
        return next(len(w.restarts) for w in self.watched if w.name == name)

    def step(self, now: float | None = None) -> list[dict]:
        if self.given_up:
            return []
        now = time.monotonic() if now is None else now
        events: list[dict] = []
        over: list[tuple[_Watched, str]] = []
        for w in self.watched:
            if w.ready_by is not None:  # restarted, not ready yet
                if isinstance(w.child, ServiceProcess) and w.child.poll_ready():
                    w.ready_by = None
                    events.append(self._restarted(w))
                elif (code := _exit_code(w.child)) is not None:
                    w.ready_by = None
                    self._exited(w, code, now, over, f"exited with code {code} before its ready line")
                elif now > w.ready_by:
                    w.ready_by = None
                    w.child.kill()
                    self._exited(w, None, now, over, f"was not ready within {self.ready_timeout:g} s of a restart")
            elif w.due is None:  # running
                if (code := _exit_code(w.child)) is not None:
                    self._exited(w, code, now, over, f"exited with code {code}")
            if w.due is not None and now >= w.due and not over:
                self._restart(w, now, events, over)
        if over:
            self.given_up = True
            events.append({"ready": False, "exited": [w.name for w, _ in over], "reason": "; ".join(r for _, r in over)})
        return events

    def _exited(self, w: _Watched, code: int | None, now: float, over: list, why: str) -> None:
        """Note an exit: restart after the backoff, or (past the limit) add (w, reason) to over."""
        w.exit_code = code
        recent = self.policy.recent(w.restarts, now)
        if recent >= self.policy.max_restarts:
            over.append((w, f"{w.name} {why} after {recent} restarts within {self.policy.window_s:g} s "
                            f"(limit {self.policy.max_restarts})"))
        else:
            w.due = now + self.policy.delay(recent)

    def _restart(self, w: _Watched, now: float, events: list, over: list) -> None:
        w.due = None
        w.restarts.append(now)
        if isinstance(w.child, EtcdProcess):
            try:
                w.child.restart(min(self.ready_timeout, 10.0))
            except LaunchError as exc:
                self._exited(w, None, time.monotonic(), over, f"was not healthy after a restart ({str(exc).splitlines()[0]})")
            else:
                events.append(self._restarted(w))
        else:
            w.child.respawn()
            w.ready_by = now + self.ready_timeout

    @staticmethod
    def _restarted(w: _Watched) -> dict:
        child = w.child
        address = child.endpoint if isinstance(child, EtcdProcess) else child.info.get("address")
        return {"restarted": w.name, "exit_code": w.exit_code, "restarts": len(w.restarts),
                "pid": child.proc.pid if child.proc is not None else None, "address": address}


def _exit_code(child: "ServiceProcess | EtcdProcess") -> int | None:
    """The child's exit status once it exited (-N: killed by signal N), None while it runs."""
    if child.proc is None:
        return -1  # gone without a process (a failed start): treat as exited
    return child.proc.poll()


def service_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"services.{module}.server", *args]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of service children: ours, with the repo on the path and one torch thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


#: The run's tokens file under the work dir (`LocalCluster` with auth).
TOKENS_FILE = "auth-tokens"
#: etcd's root password under the work dir (`LocalCluster` with auth): a rerun on the same etcd data signs in with it.
ETCD_ROOT_FILE = "etcd-root-password"
#: The services that reach etcd: each its own etcd user (of the same name) when etcd is locked.
ETCD_USERS = ("registry", "profiler", "planner")


def user_tokens(path: Path | None, admin_token: str | None) -> dict:
    """token -> user principal: the users (and scrapers, role metrics) of the tokens file at path, and
    admin_token as user 'admin' (ConfigError when the file gives that token to no admin, or names a service)."""
    from services.common import authz
    from services.common.config import ConfigError

    users = authz.read_tokens(path) if path is not None else {}
    for p in users.values():
        if p.kind not in (*authz.USERS, authz.METRICS):
            raise ConfigError(f"auth tokens file {str(path)!r} names a {p.kind} ({p.name!r}): under omru up, services "
                              "get tokens of their own; the file lists users (admin, user) and scrapers (metrics)")
    if admin_token:
        known = users.setdefault(admin_token, authz.Principal(authz.ADMIN, authz.LEGACY_ADMIN))
        if known.kind != authz.ADMIN:
            raise ConfigError(f"$OMRU_AUTH_TOKEN is {known} in {str(path)!r}: under omru up it must be an admin's token")
    return users


class LocalCluster:
    """etcd + registry + profiler + planner + N executors on this machine (a context manager)."""

    def __init__(
        self,
        nodes: int = 1,
        slots_per_node: int = 2,
        planner_port: int = 50051,
        etcd_endpoint: str | None = None,
        host: str = "127.0.0.1",
        work_dir: Path | None = None,
        log_to_files: bool = True,
        ttl_seconds: int = 5,
        auth_token: str | None = None,
        ready_timeout: float = 30.0,
        die_with_parent: bool = False,
        warm_workers: bool = True,
        planner_args: Sequence[str] = (),
        checkpoint_root: Path | None = None,
        metrics: bool = False,
        auth_tokens: Path | None = None,
    ) -> None:
        if nodes < 0:
            raise ValueError(f"nodes {nodes} is negative")
        check_token("auth token", auth_token)
        if slots_per_node < 1:
            raise ValueError(f"slots_per_node {slots_per_node} is below 1")
        if not 0 <= planner_port <= 65535:
            raise ValueError(f"planner port {planner_port} is not in 0..65535")
        self.nodes = nodes
        self.slots = slots_per_node
        self.planner_port = planner_port
        self.etcd_endpoint = etcd_endpoint
        self.host = host
        self.ttl = ttl_seconds
        self.auth_token = auth_token  # an admin user's token ($OMRU_AUTH_TOKEN)
        self.users = user_tokens(auth_tokens, auth_token)  # token -> user principal (--auth-tokens)
        self.service_tokens: dict[str, str] = {}  # service name -> its token for this run (with auth)
        self.etcd_passwords: dict[str, str] = {}  # service name -> its etcd user's password (etcd locked)
        self.ready_timeout = ready_timeout
        self.log_to_files = log_to_files
        self.warm_workers = warm_workers  # executors keep a worker with torch imported per slot
        self.planner_args = tuple(planner_args)  # more options of the planner (omru emulate's)
        self.metrics = metrics  # every service serves Prometheus metrics on a free port (ready_line's "metrics")
        self.die_with_parent = die_with_parent  # only from a launcher's main thread (the kernel ties it to the thread)
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="omru-up-"))
        # the planner names checkpoint folders under it and the executors accept only those
        self.checkpoint_root = Path(checkpoint_root or self.work_dir / "checkpoints").absolute()
        self.etcd: EtcdProcess | None = None
        self.services: list[ServiceProcess] = []
        self.seconds_to_ready = 0.0

    def _service(self, name: str, module: str, *args: str) -> ServiceProcess:
        log = self.work_dir / "logs" / f"{name}.log" if self.log_to_files else None
        extra = {"OMRU_AUTH_TOKEN": self.auth_token} if self.auth_token else {}
        if self.die_with_parent:
            extra[DIE_WITH_PARENT_ENV] = "1"
        metrics = ("--metrics-port", "0") if self.metrics else ()
        auth: tuple[str, ...] = ()
        if self.users:  # each service sends its own token; every one accepts the run's tokens file
            extra[SERVICE_TOKEN_ENV] = self.service_tokens[name]
            auth = ("--auth-tokens", str(self.work_dir / TOKENS_FILE))
        if name in self.etcd_passwords:  # the password by environment, as the service token; the user by flag
            extra[ETCD_PASSWORD_ENV] = self.etcd_passwords[name]
            args = (*args, "--etcd-user", name)
        env = child_env(extra)
        if name not in self.etcd_passwords:  # (only --etcd-user reads it, yet no child needs a stray one)
            env.pop(ETCD_PASSWORD_ENV, None)
        if not self.users:  # no auth asked for: tokens in our own environment must not turn it on in part
            for variable in (TOKEN_ENV, SERVICE_TOKEN_ENV):
                env.pop(variable, None)
        s = ServiceProcess(name, service_argv(module, "--host", self.host, *metrics, *auth, *args), env, log)
        self.services.append(s)
        return s.spawn()

    def start(self) -> "LocalCluster":
        began = time.monotonic()
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        if self.users:
            self._write_tokens()
        try:
            if self.etcd_endpoint is None:
                log = self.work_dir / "logs" / "etcd.log" if self.log_to_files else None
                self.etcd = EtcdProcess(self.work_dir / "etcd", log_file=log, die_with_parent=self.die_with_parent).start()
                self.etcd_endpoint = self.etcd.endpoint
                if self.users:
                    self._lock_etcd()
            registry = self._service("registry", "registry", "--port", "0", "--etcd", self.etcd_endpoint)
            wait_ready([registry], self.ready_timeout)
            profiler = self._service("profiler", "profiler", "--port", "0", "--etcd", self.etcd_endpoint, "--registry", registry.address)
            executors = [
                self._service(
                    f"executor-{i}", "executor", "--port", "0", "--node-id", f"node-{i}", "--registry", registry.address,
                    "--slots", str(self.slots), "--ttl", str(self.ttl),
                    "--work-dir", str(self.work_dir / f"node-{i}"), "--checkpoint-root", str(self.checkpoint_root),
                    *([] if self.warm_workers else ["--no-warm-workers"]),
                )
                for i in range(self.nodes)
            ]
            wait_ready([profiler], self.ready_timeout)  # the planner needs its address
            planner = self._service(
                "planner", "planner", "--port", str(self.planner_port), "--etcd", self.etcd_endpoint,
                "--registry", registry.address, "--profiler", profiler.address,
                "--checkpoint-root", str(self.checkpoint_root), *self.planner_args,
            )
            wait_ready([planner, *executors], self.ready_timeout)
        except BaseException:
            self.stop(keep_logs=True)
            raise
        self.seconds_to_ready = time.monotonic() - began
        return self

    def _write_tokens(self) -> None:
        """The run's tokens file (mode 600): the users', and a fresh token per service and node."""
        from services.common import authz

        names = {"registry": authz.REGISTRY, "profiler": authz.PROFILER, "planner": authz.PLANNER,
                 **{f"executor-{i}": authz.NODE for i in range(self.nodes)}}
        self.service_tokens = {name: secrets.token_hex(32) for name in names}
        table = dict(self.users)
        for name, kind in names.items():
            table[self.service_tokens[name]] = authz.Principal(kind, name.replace("executor-", "node-"))
        path = self.work_dir / TOKENS_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(authz.format_tokens(table))

    def _lock_etcd(self) -> None:
        """etcd's own authentication on: root (its password kept in the work dir, mode 600, for a rerun on
        this data) and one user per service that reaches etcd, with a fresh password each."""
        import asyncio

        from services.common.etcd import EtcdUnavailable, enable_auth

        path = self.work_dir / ETCD_ROOT_FILE
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        self.etcd_passwords = {name: secrets.token_hex(32) for name in ETCD_USERS}
        lock = enable_auth(self.etcd_endpoint, "/omru/", path.read_text().strip(), self.etcd_passwords)
        try:  # on a thread of its own: start() may be called where an event loop runs
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, lock).result()
        except EtcdUnavailable as exc:
            raise LaunchError(f"{exc} (root password from {path})") from exc

    def service(self, name: str) -> ServiceProcess:
        return next(s for s in self.services if s.name == name)

    @property
    def executors(self) -> list[ServiceProcess]:
        return [s for s in self.services if s.name.startswith("executor-")]

    def ready_line(self) -> dict:
        """What `omru up` prints: the addresses of everything started."""
        line = {
            "ready": True,
            "planner": self.service("planner").address,
            "registry": self.service("registry").address,
            "profiler": self.service("profiler").address,
            "executors": [s.address for s in self.executors],
            "etcd": self.etcd_endpoint,
            "seconds_to_ready": round(self.seconds_to_ready, 3),
            "work_dir": str(self.work_dir),
        }
        if self.metrics:  # service name ("executor-0" ...) -> host:port of its /metrics
            line["metrics"] = {s.name: s.info["metrics"] for s in self.services if s.info.get("metrics")}
        return line

    def supervisor(self, policy: RestartPolicy | None = None) -> Supervisor:
        """A Supervisor of every child started here: the services, and etcd when started here."""
        children: dict[str, ServiceProcess | EtcdProcess] = {"etcd": self.etcd} if self.etcd is not None else {}
        children.update((s.name, s) for s in self.services)
        return Supervisor(children, policy, self.ready_timeout)

    def supervise(self, stop: threading.Event, emit: Callable[[dict], None], policy: RestartPolicy | None = None,
                  interval: float = 0.2) -> int:
        """Restart children that exit until stop is set (0) or one exits past the policy's limit (1).

        emit gets every Supervisor event (`omru up` prints each as a JSON line);
        the caller stops the cluster afterwards."""
        supervisor = self.supervisor(policy)
        while not stop.wait(interval):
            for event in supervisor.step():
                emit(event)
            if supervisor.given_up:
                return 1
        return 0

    def stop(self, keep_logs: bool = False) -> None:
        """Stop every child (executors first, etcd last) and remove an own temp dir (unless keep_logs)."""
        for s in reversed(self.services):
            if s.name.startswith("executor-"):
                s.stop()
        for s in reversed(self.services):
            s.stop()
        if self.etcd is not None:
            self.etcd.stop()
        if self._own_dir and not keep_logs:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
