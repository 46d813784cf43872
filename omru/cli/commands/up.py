"""`omru up`: a whole local cluster (etcd, registry, profiler, planner, N
executors) as child processes, one JSON ready line, a child that exits
restarted (services.common.cluster.Supervisor), stop on SIGINT/SIGTERM."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "up",
        help="start a local cluster and run it until Ctrl-C (--detach: in the background until omru down)",
        description=(
            "Start etcd (unless --etcd), the registry, profiler, planner and N executors, each on its own "
            "loopback port (and its Prometheus metrics on another); print one JSON line with their addresses; restart a child that exits (same port, "
            "backoff 0.5 s doubling to 8 s, one JSON line per restart), giving up and stopping everything "
            "(exit status 1) past --max-restarts within 60 s; stop everything on SIGINT/SIGTERM."
        ),
    )
    parser.add_argument("--nodes", type=int, default=1, help="executors (nodes) to start (default 1)")
    parser.add_argument("--slots-per-node", "--slots", dest="slots", type=int, default=2, help="CPU slots per node when NVML finds no GPU (default 2)")
    parser.add_argument("--port", type=int, default=50051, help="planner port (default 50051; 0 = any free port)")
    parser.add_argument("--etcd", default=None, help="use this etcd (host:port) instead of starting one")
    parser.add_argument("--ttl", type=int, default=5, help="node lease TTL in seconds (default 5)")
    parser.add_argument("--no-warm-workers", action="store_true",
                        help="start every worker cold (default: one waits per slot with torch imported)")
    parser.add_argument("--max-restarts", type=int, default=5,
                        help="restarts of one child within 60 s before giving up and stopping the cluster "
                             "(default 5; 0: stop at the first exit)")
    parser.add_argument("--no-metrics", action="store_true",
                        help="serve no Prometheus metrics (default: every service serves /metrics on a free port "
                             "of 127.0.0.1, named in the ready line's \"metrics\")")
    parser.add_argument("--auth-tokens", default=None, metavar="FILE",
                        help="users' bearer tokens, a line 'token name role' each (role admin or user, or metrics: "
                             "a scraper, which reads /metrics and calls no RPC); with it or "
                             "$OMRU_AUTH_TOKEN (an admin's token) every service requires a token, and each service and "
                             "node gets its own for this run")
    parser.add_argument("--work-dir", default=None, help="directory for logs, etcd data and checkpoints (default: a temp dir, removed at exit)")
    parser.add_argument("--detach", "-d", action="store_true",
                        help="run the cluster in the background (its own process group, output to up.log beside "
                             "the context file), print the ready line once it is ready and exit 0; `omru down` stops it")
    parser.add_argument("--ready-timeout", type=float, default=180.0,
                        help="with --detach: seconds to wait for the ready line before stopping it (default 180)")
    parser.add_argument("--detached-log", default=None, help=argparse.SUPPRESS)  # set by --detach for the child
    parser.set_defaults(func=handle)


def _check(args: argparse.Namespace) -> None:
    from omru.cli.main import CliError

    if not 0 <= args.nodes <= 64:
        raise CliError(f"--nodes {args.nodes} is not in 0..64")
    if not 1 <= args.slots <= 1024:
        raise CliError(f"--slots-per-node {args.slots} is not in 1..1024")
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port} is not in 0..65535")
    if not 1 <= args.ttl <= 3600:
        raise CliError(f"--ttl {args.ttl} is not in 1..3600")
    if not 0 <= args.max_restarts <= 1000:
        raise CliError(f"--max-restarts {args.max_restarts} is not in 0..1000")
    if not 1 <= args.ready_timeout <= 3600:
        raise CliError(f"--ready-timeout {args.ready_timeout} is not in 1..3600")
    if args.auth_tokens is not None:  # a bad file (or $OMRU_AUTH_TOKEN naming no admin) stops us before anything starts
        import os
        from pathlib import Path

        from services.common.cluster import user_tokens
        from services.common.config import ConfigError

        try:
            user_tokens(Path(args.auth_tokens), os.environ.get("OMRU_AUTH_TOKEN") or None)
        except ConfigError as exc:
            raise CliError(str(exc)) from None
    if args.etcd is not None:
        host, sep, port = args.etcd.removeprefix("http://").rpartition(":")
        if not sep or not host or not port.isdigit():
            raise CliError(f"--etcd {args.etcd!r} is not host:port")
        args.etcd = f"{host}:{port}"


def _running():
    """The context, when it names an `omru up` that still runs (else None: none, stale or unreadable)."""
    from omru import context

    try:
        ctx = context.load()
    except context.ContextError:
        return None  # unreadable: replaced once this cluster is ready
    return ctx if ctx is not None and context.alive(ctx) else None


def _child_argv(args: argparse.Namespace) -> list[str]:
    """The arguments of `omru up` that --detach passes on to the cluster it starts."""
    import os

    argv = ["--nodes", str(args.nodes), "--slots-per-node", str(args.slots), "--port", str(args.port),
            "--ttl", str(args.ttl), "--max-restarts", str(args.max_restarts)]
    if args.etcd:
        argv += ["--etcd", args.etcd]
    if args.no_warm_workers:
        argv.append("--no-warm-workers")
    if args.no_metrics:
        argv.append("--no-metrics")
    if args.work_dir:
        argv += ["--work-dir", os.path.abspath(args.work_dir)]
    if args.auth_tokens:
        argv += ["--auth-tokens", os.path.abspath(args.auth_tokens)]
    return argv


def _context_of(ready: dict, log: str | None):
    import os
    import time

    from omru import context

    return context.Context(
        planner=ready["planner"], registry=ready["registry"], profiler=ready["profiler"], etcd=ready["etcd"] or "",
        executors=list(ready["executors"]), metrics=dict(ready.get("metrics") or {}),
        token=os.environ.get("OMRU_AUTH_TOKEN") or None, pid=os.getpid(),
        started=context.process_identity(os.getpid()) or f"{os.getpid()}:", started_unix_s=round(time.time(), 3),
        work_dir=ready.get("work_dir", ""), log=log or "")


def detach(args: argparse.Namespace) -> int:
    """Start `omru up` (these arguments, without --detach) in a new session with its output in up.log
    beside the context; print its ready line once ready (exit 0), else its last lines (exit 2 when it
    exited with 2, a usage error, else 1). Interrupted while waiting, it stops the cluster it started."""
    import os
    import subprocess
    import sys

    from omru import context

    where = context.path()
    where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = where.parent / "up.log"
    argv = _child_argv(args)
    with open(log, "wb") as out:
        os.chmod(log, 0o600)
        proc = subprocess.Popen([sys.executable, "-m", "omru", "up", *argv, "--detached-log", str(log)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                env={**os.environ, "OMRU_CONTEXT": str(where)})
    try:
        return _await_ready(proc, log, args.ready_timeout)
    except KeyboardInterrupt:
        _stop_group(proc)
        raise


def _stop_group(proc) -> None:
    import os
    import signal
    import subprocess

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _await_ready(proc, log, timeout: float) -> int:
    import json
    import sys
    import time

    deadline = time.monotonic() + timeout
    seen = 0
    while True:
        text = log.read_text(errors="replace")
        for line in text[seen:].splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            seen += len(line)
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("ready") is True:
                print(line.rstrip("\n"), flush=True)
                return 0
            if event.get("ready") is False:
                print(line.rstrip("\n"), flush=True)
        code = proc.poll()
        if code is not None or time.monotonic() > deadline:
            if code is None:
                _stop_group(proc)
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
            why = f"exited with status {code}" if code is not None else f"was not ready within {timeout:g} s"
            print(f"omru up --detach: the cluster {why}; {log} ends:\n{tail}", file=sys.stderr)
            return 2 if code == 2 else 1
        time.sleep(0.1)


def handle(args: argparse.Namespace) -> int:
    import json
    import os
    import signal
    import sys
    import threading
    from pathlib import Path

    from omru import context
    from omru.cli.main import CliError
    from services.common.cluster import LaunchError, LocalCluster, RestartPolicy

    _check(args)
    running = _running()
    if running is not None and (args.detach or args.detached_log):
        raise CliError(f"a cluster is already running (omru up pid {running.pid}, planner {running.planner}; context "
                       f"{context.path()}): stop it with `omru down`, or set $OMRU_CONTEXT to use another context")
    if args.detach:
        return detach(args)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    cluster = LocalCluster(
        nodes=args.nodes,
        slots_per_node=args.slots,
        planner_port=args.port,
        etcd_endpoint=args.etcd,
        ttl_seconds=args.ttl,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        auth_token=os.environ.get("OMRU_AUTH_TOKEN") or None,
        die_with_parent=True,
        warm_workers=not args.no_warm_workers,
        metrics=not args.no_metrics,
        auth_tokens=Path(args.auth_tokens) if args.auth_tokens else None,
    )
    try:
        cluster.start()
    except LaunchError as exc:
        raise CliError(str(exc).splitlines()[0] + f" (logs under {cluster.work_dir / 'logs'})") from exc
    own = None
    try:
        ready = cluster.ready_line()
        other = _running()
        if other is not None:  # a context stays with the cluster it names while that one runs
            print(f"omru up: warning: the context {context.path()} names another running cluster (omru up pid "
                  f"{other.pid}); this one is not written to it: pass its addresses, or set $OMRU_CONTEXT",
                  file=sys.stderr, flush=True)
        else:
            try:  # the context first: once the ready line is out, every command finds the cluster
                own = _context_of(ready, args.detached_log)
                ready["context"] = str(context.write(own))
            except OSError as exc:
                own = None
                print(f"omru up: warning: no context written ({context.path()}: {exc.strerror}); "
                      f"commands need --planner etc.", file=sys.stderr, flush=True)
        print(json.dumps(ready), flush=True)
        # {"restarted": ...} per restart; {"ready": false, "exited": [...], "reason": ...} and 1 past the limit
        return cluster.supervise(stop, lambda event: print(json.dumps(event), flush=True),
                                 RestartPolicy(max_restarts=args.max_restarts))
    finally:
        if own is not None:
            context.remove_if_own(own.started)
        cluster.stop()
