"""`omru logs JOB`: what a job's processes printed (stdout and stderr), from every node that ran it.

The planner asks each node's executor for the logs of the job's attempts on
it (PlannerService.GetJobLogs); with --registry the command asks the nodes
that registry lists itself (a cluster without a planner). Lines are prefixed
with the node and rank unless --rank picks one.
"""

from __future__ import annotations

import sys

from omru.cli import plannerargs


def register(subparsers) -> None:
    p = subparsers.add_parser("logs", help="print a job's stdout/stderr from the nodes that ran it",
                              description=__doc__)
    p.add_argument("job", help="job id")
    p.add_argument("--rank", type=int, default=None, help="only this rank (default: every rank)")
    p.add_argument("--attempt", type=int, default=0,
                   help="the Nth attempt on each node, 1 = the first (default 0: the newest)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the attempt ends")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop after this many seconds (default: 60; with --follow, a day)")
    p.add_argument("--registry", default=None,
                   help="ask the nodes of this registry (host:port) directly instead of the planner")
    plannerargs.add(p)
    p.set_defaults(func=handle)


def handle(args) -> int:
    import grpc

    from omru.cli.main import CliError

    if not args.job:
        raise CliError("job id is empty")
    for name in ("rank", "attempt"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            raise CliError(f"--{name} {getattr(args, name)} is negative")
    if args.timeout is not None and not args.timeout > 0:
        raise CliError(f"--timeout {args.timeout} must be > 0")
    out = _Printer(prefixed=args.rank is None, interleaved=args.follow)
    if args.registry is not None:
        return _direct(args, out)
    with plannerargs.client(args) as c:
        try:
            for chunk in c.logs(args.job, rank=args.rank, attempt=args.attempt, follow=args.follow,
                                timeout_s=args.timeout):
                out.write(chunk.node_id, chunk.rank, chunk.data)
        except grpc.RpcError as exc:
            raise plannerargs.rpc_error(exc) from None
        finally:
            out.flush()
    return 0


def _direct(args, out: "_Printer") -> int:
    """--registry: read through services.planner.logs here, as the planner would."""
    import asyncio

    from omru.cli.errors import CliError, unreachable
    from services.planner import logs

    conn = plannerargs.connection(args, "registry")

    async def read() -> None:
        try:
            async for c in logs.read(conn.address, args.job, args.attempt, args.rank, args.follow, args.timeout,
                                     token=conn.token, tls=plannerargs.tls_of(conn)):
                out.write(c.node_id, c.rank, c.data)
        except logs.NodeFailed as exc:
            # the registry itself not there (services.planner.logs names it first): exit 3, like the planner
            if str(exc).startswith(f"registry {conn.address}: UNAVAILABLE:") or \
                    str(exc).startswith(f"registry {conn.address}: DEADLINE_EXCEEDED:"):
                raise unreachable("registry", conn.address, conn.source) from None
            raise CliError(str(exc)) from None
        except (logs.NoLogs, logs.BadRequest) as exc:
            raise CliError(str(exc)) from None
        finally:
            out.flush()

    asyncio.run(read())
    return 0


class _Printer:
    """Writes chunks to stdout whole lines at a time, each prefixed with its node and rank when asked.

    Without --follow each rank's log comes whole, one after the other: a
    last line without a newline is printed when the next log begins."""

    def __init__(self, prefixed: bool, interleaved: bool) -> None:
        self.prefixed, self.interleaved = prefixed, interleaved
        self.partial: dict[tuple[str, int], bytes] = {}

    def write(self, node_id: str, rank: int, data: bytes) -> None:
        key = (node_id, rank)
        if not self.interleaved and key not in self.partial:
            self.flush()
        lines = (self.partial.pop(key, b"") + data).split(b"\n")
        self.partial[key] = lines.pop()
        self._print(key, lines)

    def flush(self) -> None:
        for key in list(self.partial):
            rest = self.partial.pop(key)
            if rest:
                self._print(key, [rest])

    def _print(self, key: tuple[str, int], lines: list[bytes]) -> None:
        prefix = f"[{key[0]} rank {key[1]}] " if self.prefixed else ""
        for line in lines:
            sys.stdout.write(prefix + line.decode(errors="replace") + "\n")
        sys.stdout.flush()
