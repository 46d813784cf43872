"""`omru status`: one line per job (state, epochs, world size, accuracy) and the plan in force."""

from __future__ import annotations

from omru.cli import plannerargs


def register(subparsers) -> None:
    p = subparsers.add_parser("status", help="show every job and the plan", description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--state", action="append", default=[], metavar="STATE",
                   help="only jobs in this state (running, failed, ...); repeat for several")
    plannerargs.add(p)
    p.set_defaults(func=handle)


def handle(args) -> int:
    import json
    from dataclasses import asdict

    import grpc

    from omru.cli.main import CliError

    with plannerargs.client(args) as c:
        try:
            jobs, plan = c.list_jobs(states=args.state), c.plan()
        except ValueError as exc:
            raise CliError(f"--state: {exc}") from None
        except grpc.RpcError as exc:
            raise plannerargs.rpc_error(exc) from None
    if args.json:
        print(json.dumps({"jobs": [asdict(j) for j in jobs], "plan": asdict(plan)}))
        return 0
    print(f"plan v{plan.version} ({plan.policy or 'none yet'}), planned makespan {plan.makespan_s:.1f} s")
    for j in jobs:
        print(f"{j.job_id:<20} {j.state.lower():<10} epochs {j.epochs_done:>3}  world {j.world_size}  "
              f"accuracy {100 * j.accuracy:5.1f}%  {j.message}")
    return 0
