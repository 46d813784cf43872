"""A job's logs from every node that ran it (PlannerService.GetJobLogs; `omru logs`).

The registry lists the live nodes; each node's executor serves what the
job's ranks printed there (ExecutorService.GetLogs, from its work folder).
`read` asks them node after node (sorted by id), or all at once with
``follow`` (chunks interleaved as they come), and yields every chunk. A node
that never ran the job (NOT_FOUND) is skipped; `NoLogs` when no node has
its logs, `NodeFailed` naming each node that could not be read. Every call
has a deadline: ``deadline_s`` (at most READ_DEADLINE_S, or FOLLOW_DEADLINE_S
with follow) for the whole read.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

import grpc

from omru.v1 import executor_pb2, executor_pb2_grpc, registry_pb2, registry_pb2_grpc
from services.common.channels import open_channel

#: Deadline of the registry's ListNodes (seconds).
LIST_DEADLINE_S = 10.0
#: Deadline of a read without follow when the caller gives none (seconds).
READ_DEADLINE_S = 60.0
#: Deadline of a read with follow when the caller gives none (seconds).
FOLLOW_DEADLINE_S = 24 * 3600.0


class NoLogs(LookupError):
    """No node has logs of the job; the message says what each node answered."""


class NodeFailed(RuntimeError):
    """Some nodes could not be read; the message names each and its error."""


class BadRequest(ValueError):
    """A node refused the request as invalid; the message names the field."""


async def read(registry: str, job_id: str, attempt: int = 0, rank: int | None = None, follow: bool = False,
               deadline_s: float | None = None, token: str | None = None,
               tls=None) -> AsyncIterator[executor_pb2.GetLogsResponse]:
    """Every chunk of the job's logs on the nodes the registry lists (see the module docstring)."""
    loop = asyncio.get_running_loop()
    longest = FOLLOW_DEADLINE_S if follow else READ_DEADLINE_S
    end = loop.time() + min(deadline_s or longest, longest)
    async with open_channel(registry, token=token, tls=tls) as channel:
        try:
            reply = await registry_pb2_grpc.RegistryServiceStub(channel).ListNodes(
                registry_pb2.ListNodesRequest(), timeout=min(LIST_DEADLINE_S, max(end - loop.time(), 0.1)))
        except grpc.aio.AioRpcError as exc:
            raise NodeFailed(f"registry {registry}: {exc.code().name}: {exc.details()}") from None
    nodes = sorted(reply.nodes, key=lambda n: n.node_id)
    request = executor_pb2.GetLogsRequest(job_id=job_id, attempt=attempt, follow=follow)
    if rank is not None:
        request.rank = rank
    answers = _Answers(job_id)

    async def one(node) -> AsyncIterator[executor_pb2.GetLogsResponse]:
        async with open_channel(node.address, token=token, tls=tls) as ch:
            call = executor_pb2_grpc.ExecutorServiceStub(ch).GetLogs(request, timeout=max(end - loop.time(), 0.1))
            try:
                async for chunk in call:
                    yield chunk
                answers.read.append(node.node_id)
            except grpc.aio.AioRpcError as exc:
                answers.add(node, exc, follow)

    if not follow:
        for node in nodes:  # node after node, never interleaved
            async with contextlib.aclosing(one(node)) as chunks:
                async for chunk in chunks:
                    yield chunk
    else:
        queue: asyncio.Queue = asyncio.Queue(maxsize=64)

        async def pump(node) -> None:
            async with contextlib.aclosing(one(node)) as chunks:
                async for chunk in chunks:
                    await queue.put(chunk)

        tasks = {asyncio.ensure_future(pump(n)) for n in nodes}
        pending, getter = set(tasks), None
        try:
            while pending or not queue.empty():
                getter = asyncio.ensure_future(queue.get())
                done, pending = await asyncio.wait({getter, *pending}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(getter)
                for t in done - {getter}:
                    t.result()  # (a bug in a pump surfaces here)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()  # (a get cancelled before it took a chunk leaves it queued)
        finally:
            for t in [*tasks, *([getter] if getter else [])]:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    answers.check(bool(nodes))


class _Answers:
    """What the nodes answered: read (ids), absent (NOT_FOUND reasons), failed (other errors)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.read: list[str] = []
        self.absent: list[str] = []
        self.failed: list[str] = []
        self.invalid = ""

    def add(self, node, exc: grpc.aio.AioRpcError, follow: bool) -> None:
        code = exc.code()
        if code == grpc.StatusCode.NOT_FOUND:
            self.absent.append(f"{node.node_id}: {exc.details()}")
        elif code == grpc.StatusCode.INVALID_ARGUMENT:
            self.invalid = exc.details()
        elif follow and code == grpc.StatusCode.DEADLINE_EXCEEDED:
            self.read.append(node.node_id)  # (following ends at the deadline)
        else:
            self.failed.append(f"{node.node_id} ({node.address}): {code.name}: {exc.details()}")

    def check(self, any_node: bool) -> None:
        if self.invalid:
            raise BadRequest(self.invalid)
        if self.failed:
            raise NodeFailed("; ".join(self.failed))
        if not self.read:
            why = "; ".join(self.absent) if any_node else "the registry lists no node"
            raise NoLogs(f"no logs of job {self.job_id!r} on any node ({why})")
