"""`omru up`: a whole local cluster (etcd, registry, profiler, planner, N
executors) as child processes, one JSON ready line, a child that exits
restarted (services.common.cluster.Supervisor), stop on SIGINT/SIGTERM."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "up",
        help="start a local cluster and run it until Ctrl-C",
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
    parser.add_argument("--work-dir", default=None, help="directory for logs, etcd data and checkpoints (default: a temp dir, removed at exit)")
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
    if args.etcd is not None:
        host, sep, port = args.etcd.removeprefix("http://").rpartition(":")
        if not sep or not host or not port.isdigit():
            raise CliError(f"--etcd {args.etcd!r} is not host:port")
        args.etcd = f"{host}:{port}"


def handle(args: argparse.Namespace) -> int:
    import json
    import os
    import signal
    import threading
    from pathlib import Path

    from omru.cli.main import CliError
    from services.common.cluster import LaunchError, LocalCluster, RestartPolicy

    _check(args)
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
    )
    try:
        cluster.start()
    except LaunchError as exc:
        raise CliError(str(exc).splitlines()[0] + f" (logs under {cluster.work_dir / 'logs'})") from exc
    try:
        print(json.dumps(cluster.ready_line()), flush=True)
        # {"restarted": ...} per restart; {"ready": false, "exited": [...], "reason": ...} and 1 past the limit
        return cluster.supervise(stop, lambda event: print(json.dumps(event), flush=True),
                                 RestartPolicy(max_restarts=args.max_restarts))
    finally:
        cluster.stop()
