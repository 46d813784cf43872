"""`omru logs JOB`: what a job's processes printed (stdout and stderr), from every node that ran it.

The registry lists the nodes; each node's executor serves the logs of the
job's attempts on it (ExecutorService.GetLogs). Lines are prefixed with the
node and rank unless --rank picks one.
"""

from __future__ import annotations

import os
import sys

from omru.cli import plannerargs

#: Deadline of a read without --follow, and of the registry call (seconds).
DEADLINE_S = 30.0
#: Deadline of a --follow read without --timeout (seconds).
FOLLOW_DEADLINE_S = 24 * 3600.0


def register(subparsers) -> None:
    p = subparsers.add_parser("logs", help="print a job's stdout/stderr from the nodes that ran it",
                              description=__doc__)
    p.add_argument("job", help="job id")
    p.add_argument("--rank", type=int, default=None, help="only this rank (default: every rank)")
    p.add_argument("--attempt", type=int, default=0,
                   help="the Nth attempt on each node, 1 = the first (default 0: the newest)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the attempt ends")
    p.add_argument("--timeout", type=float, default=None, help="with --follow: stop after this many seconds")
    p.add_argument("--registry", default=None,
                   help="registry address host:port (default: $OMRU_REGISTRY; `omru up` prints it)")
    p.add_argument("--token", default=None, help="bearer token (default: $OMRU_AUTH_TOKEN)")
    plannerargs.add_tls(p)
    p.set_defaults(func=handle)


def handle(args) -> int:
    import asyncio

    from omru.cli.main import CliError

    registry = args.registry or os.environ.get("OMRU_REGISTRY") or ""
    host, sep, port = registry.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise CliError(f"--registry {registry!r} is not host:port (give --registry or set $OMRU_REGISTRY)")
    for name in ("rank", "attempt"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            raise CliError(f"--{name} {getattr(args, name)} is negative")
    if args.timeout is not None and args.timeout <= 0:
        raise CliError(f"--timeout {args.timeout} must be > 0")
    return asyncio.run(_read(args, registry))


async def _read(args, registry: str) -> int:
    import asyncio

    import grpc

    from omru.cli.main import CliError
    from omru.v1 import executor_pb2, executor_pb2_grpc, registry_pb2, registry_pb2_grpc
    from services.common.channels import open_channel

    token, tls = args.token or os.environ.get("OMRU_AUTH_TOKEN"), plannerargs.tls(args)
    async with open_channel(registry, token=token, tls=tls) as channel:
        try:
            nodes = (await registry_pb2_grpc.RegistryServiceStub(channel).ListNodes(
                registry_pb2.ListNodesRequest(), timeout=DEADLINE_S)).nodes
        except grpc.aio.AioRpcError as exc:
            raise CliError(f"registry {registry} said {exc.code().name}: {exc.details()}") from None
    request = executor_pb2.GetLogsRequest(job_id=args.job, attempt=args.attempt, follow=args.follow)
    if args.rank is not None:
        request.rank = args.rank
    deadline = (args.timeout or FOLLOW_DEADLINE_S) if args.follow else DEADLINE_S
    out = _Printer(prefixed=args.rank is None)
    found: list[str] = []
    missing: list[str] = []

    async def one(node) -> None:
        async with open_channel(node.address, token=token, tls=tls) as ch:
            call = executor_pb2_grpc.ExecutorServiceStub(ch).GetLogs(request, timeout=deadline)
            try:
                async for chunk in call:
                    if node.node_id not in found:
                        found.append(node.node_id)
                    out.write(node.node_id, chunk.rank, chunk.data)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    missing.append(f"{node.node_id}: {exc.details()}")
                elif exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise CliError(f"{node.node_id} said {exc.details()}") from None
                elif not (args.follow and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
                    print(f"omru logs: {node.node_id} ({node.address}) said {exc.code().name}: {exc.details()}",
                          file=sys.stderr)
            finally:
                out.flush(node.node_id)

    if args.follow:
        await asyncio.gather(*(one(n) for n in nodes))
    else:
        for n in sorted(nodes, key=lambda n: n.node_id):  # node after node, never interleaved
            await one(n)
    if not found:
        why = "; ".join(missing) if missing else "the registry lists no node"
        raise CliError(f"no logs of job {args.job!r} on any node ({why})")
    return 0


class _Printer:
    """Writes chunks to stdout whole lines at a time, each prefixed with its node and rank when asked."""

    def __init__(self, prefixed: bool) -> None:
        self.prefixed = prefixed
        self.partial: dict[tuple[str, int], bytes] = {}

    def write(self, node_id: str, rank: int, data: bytes) -> None:
        key = (node_id, rank)
        lines = (self.partial.pop(key, b"") + data).split(b"\n")
        self.partial[key] = lines.pop()
        self._print(key, lines)

    def flush(self, node_id: str) -> None:
        for key in [k for k in self.partial if k[0] == node_id]:
            rest = self.partial.pop(key)
            if rest:
                self._print(key, [rest])

    def _print(self, key: tuple[str, int], lines: list[bytes]) -> None:
        prefix = f"[{key[0]} rank {key[1]}] " if self.prefixed else ""
        for line in lines:
            sys.stdout.write(prefix + line.decode(errors="replace") + "\n")
        sys.stdout.flush()
