"""`omru demo`: start a local cluster, submit examples/demo.yaml, watch it train, report, stop.

The default cluster is one node with 2 CPU slots (no more slots than this
machine's cores, so epoch times measured alone still hold side by side).
"""

from __future__ import annotations

from pathlib import Path

DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.yaml"


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the demo workload end to end on a local cluster", description=__doc__)
    p.add_argument("--workload", default=str(DEMO), help="workload YAML (default: examples/demo.yaml)")
    p.add_argument("--nodes", type=int, default=1, help="executor nodes (default 1)")
    p.add_argument("--slots", type=int, default=2, help="CPU slots per node (default 2)")
    p.add_argument("--json", dest="json_file", default=None, metavar="FILE", help="write the report as JSON")
    p.add_argument("--gantt", default=None, metavar="FILE.png", help="draw GPUs over time, planned and actual")
    p.add_argument("--no-warm-workers", action="store_true",
                   help="start every worker cold (default: one waits per slot with torch imported)")
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds (default 600)")
    p.set_defaults(func=handle)


def handle(args) -> int:
    import time

    import grpc

    from omru import workload
    from omru.cli import plannerargs
    from omru.cli.commands import report, watch
    from omru.cli.main import CliError
    from omru.client import SyncClient
    from services.common.cluster import LaunchError, LocalCluster

    if not 1 <= args.nodes <= 16:
        raise CliError(f"--nodes {args.nodes} is not in 1..16")
    if not 1 <= args.slots <= 64:
        raise CliError(f"--slots {args.slots} is not in 1..64")
    gpus = args.nodes * args.slots
    try:
        w = workload.load(args.workload, cluster_gpus=gpus)
    except workload.WorkloadError as exc:
        raise CliError(str(exc).replace("\n", " ")) from None
    began = time.monotonic()
    try:
        cluster = LocalCluster(nodes=args.nodes, slots_per_node=args.slots, planner_port=0,
                               warm_workers=not args.no_warm_workers).start()
    except LaunchError as exc:
        raise CliError(f"the local cluster did not start: {exc}") from None
    try:
        print(f"cluster up in {cluster.seconds_to_ready:.1f} s: {args.nodes} node(s) x {args.slots} slot(s)", flush=True)
        with SyncClient(cluster.service("planner").address) as c:
            try:
                ids = c.submit(w)
                print(f"submitted {len(ids)} jobs: {', '.join(ids)}", flush=True)
                latest = watch.follow(c, timeout_s=args.timeout, epochs={j.id: j.spec.epochs for j in w.jobs})
                f = report.write(c.report_proto(), args.json_file, args.gantt, plan=c.plan(), jobs=c.list_jobs())
            except grpc.RpcError as exc:
                raise plannerargs.rpc_error(exc) from None
    finally:
        cluster.stop()
    wall = time.monotonic() - began
    print(f"demo wall time {wall:.1f} s")
    ok = all(s.state == "FINISHED" for s in latest.values()) and len(latest) == len(w.jobs)
    return 0 if ok and f.all_finished else 1

