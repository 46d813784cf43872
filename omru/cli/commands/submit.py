"""`omru submit WORKLOAD.yaml`: validate a workload file and submit its jobs to the planner."""

from __future__ import annotations

from omru.cli import plannerargs


def register(subparsers) -> None:
    p = subparsers.add_parser("submit", help="submit the jobs of a workload YAML file", description=__doc__)
    p.add_argument("workload", help="workload YAML (format: see omru/workload.py or the README)")
    p.add_argument("--policy", default="", help="planning policy (default: the file's, else the planner's)")
    plannerargs.add(p)
    p.set_defaults(func=handle)


def handle(args) -> int:
    import grpc

    from omru import workload
    from omru.cli.main import CliError

    try:
        w = workload.load(args.workload)
    except workload.WorkloadError as exc:
        raise CliError(str(exc).replace("\n", " ")) from None
    with plannerargs.client(args) as c:
        try:
            ids = c.submit(w, policy=args.policy)
        except grpc.RpcError as exc:
            raise plannerargs.rpc_error(exc) from None
    print(f"submitted {len(ids)} job(s): {', '.join(ids)}")
    return 0
