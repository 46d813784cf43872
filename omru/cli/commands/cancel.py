"""`omru cancel JOB`: cancel a job (its workers stop; its GPUs go to other jobs)."""

from __future__ import annotations

from omru.cli import plannerargs


def register(subparsers) -> None:
    p = subparsers.add_parser("cancel", help="cancel a job", description=__doc__)
    p.add_argument("job", help="job id")
    plannerargs.add(p)
    p.set_defaults(func=handle)


def handle(args) -> int:
    import grpc

    with plannerargs.client(args) as c:
        try:
            state = c.cancel(args.job)
        except grpc.RpcError as exc:
            raise plannerargs.rpc_error(exc) from None
    print(f"{args.job}: {state.lower()}")
    return 0
