"""omru.v1.ExecutorService: thin gRPC layer over `services.executor.supervisor`.

`AllocationWatch` keeps the node's workers at the allocations the planner
wrote for it (the planner holds their GPU claims; profiling trials are such
allocations too): the one way work reaches an executor. An allocation the
supervisor refuses (`DirectiveError` naming the field, `ConflictError`)
changes nothing and is reported as a FAILED event (`is_refusal`).
Allocations name folders only under the node's `convert.Roots` (checkpoint
root, data roots). The service itself only answers what runs (GetJobs),
what happened (WatchEvents) and what the workers printed (GetLogs).
`RegistryNodes` tells the supervisor which nodes are alive (a job's ranks on
a lost node end its attempt at once).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Sequence

import grpc

from omru.v1 import common_pb2, executor_pb2, executor_pb2_grpc, registry_pb2, registry_pb2_grpc
from services.common.errors import abort, abort_invalid
from services.common.logging import get_logger
from services.executor import convert
from services.executor.logs import LogError
from services.executor.supervisor import ConflictError, DirectiveError, EventKind, Supervisor

log = get_logger(__name__)

#: Deadline of each registry call of a Supervisor.
REGISTRY_DEADLINE_S = 5.0


#: The word a FAILED event's message has after the directive's id when the directive was refused
#: (nothing ran: the planner puts the job back rather than failing it).
REFUSED = "refused"


def is_refusal(message: str) -> bool:
    """True for the message of a FAILED event that reports a refused directive."""
    return message.startswith("directive '") and f"' {REFUSED}: " in message


class RegistryNodes:
    """The nodes the registry lists (ListNodes), for a Supervisor."""

    def __init__(self, channel: grpc.aio.Channel, deadline_s: float = REGISTRY_DEADLINE_S) -> None:
        self.stub = registry_pb2_grpc.RegistryServiceStub(channel)
        self.deadline_s = deadline_s

    async def nodes(self) -> set[str]:
        listing = await self.stub.ListNodes(registry_pb2.ListNodesRequest(), timeout=self.deadline_s)
        return {n.node_id for n in listing.nodes}


def devices_of(gpus: Sequence[common_pb2.GpuInfo]) -> dict[int, str]:
    """GPU index -> worker device ("cpu" for a CPU slot, else the GPU index)."""
    return {g.index: "cpu" if g.kind == "cpu" else str(g.index) for g in gpus}


class ExecutorServicer(executor_pb2_grpc.ExecutorServiceServicer):
    """omru.v1.ExecutorService of one node."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    async def GetJobs(self, request, context):
        return executor_pb2.GetJobsResponse(node_id=self.supervisor.node_id,
                                            jobs=[convert.job(v) for v in self.supervisor.jobs()],
                                            last_seq=self.supervisor.events.last_seq)

    async def WatchEvents(self, request, context):
        if request.after_seq < 0:
            await abort_invalid(context, "after_seq", f"{request.after_seq} is negative")
        async for event in self.supervisor.events.follow(request.after_seq):
            yield executor_pb2.WatchEventsResponse(event=convert.event(event))

    async def GetLogs(self, request, context):
        rank = request.rank if request.HasField("rank") else None
        try:
            async for c in self.supervisor.read_logs(request.job_id, request.attempt, rank, request.offset, request.follow):
                yield executor_pb2.GetLogsResponse(node_id=self.supervisor.node_id, attempt=c.attempt.number,
                                                   attempt_id=c.attempt.attempt_id, rank=c.rank, data=c.data,
                                                   offset=c.offset)
        except LogError as exc:
            await abort_invalid(context, exc.field, str(exc).split(": ", 1)[1])
        except LookupError as exc:
            await abort(context, grpc.StatusCode.NOT_FOUND, str(exc.args[0]))


class AllocationWatch:
    """Keeps the node's workers at its allocations (RegistryService.WatchAllocations).

    The stream begins with the node's whole desired state (a snapshot), then
    every change; each is reconciled at once: an allocation starts its job's
    attempt or moves the job to it (at the next epoch boundary), a removed one
    stops the job. A job running here under an allocation the snapshot lacks
    is stopped. An allocation the supervisor refuses is reported as a FAILED
    event naming the refusal (the planner puts the job back to wait). Changes
    older than the newest revision seen are ignored. A broken stream is
    reopened after a backoff that doubles up to max_backoff_s. Allocations
    name folders only under roots (None: `convert.Roots()`).
    """

    def __init__(self, channel: grpc.aio.Channel, supervisor: Supervisor, initial_backoff_s: float = 0.2,
                 max_backoff_s: float = 5.0, roots: convert.Roots | None = None) -> None:
        self.stub = registry_pb2_grpc.RegistryServiceStub(channel)
        self.supervisor = supervisor
        self.roots = roots or convert.Roots()
        self.initial_backoff_s, self.max_backoff_s = initial_backoff_s, max_backoff_s
        self.connected = asyncio.Event()
        self.revision = 0  # newest revision reconciled
        self.desired: dict[str, executor_pb2.Directive] = {}  # job -> its allocation of this node
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="allocation-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        backoff = self.initial_backoff_s
        node_id = self.supervisor.node_id
        while True:
            try:
                async for response in self.stub.WatchAllocations(registry_pb2.WatchAllocationsRequest(node_id=node_id)):
                    self.connected.set()
                    backoff = self.initial_backoff_s
                    await self.reconcile(response)
                log.info("allocation_stream_ended", node_id=node_id)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.warning("allocation_stream_broken", node_id=node_id, code=exc.code().name, details=exc.details(),
                            retry_in_s=backoff)
            self.connected.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    async def reconcile(self, response: registry_pb2.WatchAllocationsResponse) -> None:
        """Bring the workers to one response of the stream."""
        if response.revision < self.revision:
            log.warning("stale_allocations_ignored", revision=response.revision, newest=self.revision)
            return
        self.revision = response.revision
        removed = list(response.removed_job_ids)
        if response.snapshot:
            wanted = {d.job.job_id for d in response.allocations}
            removed += [j for j in self.desired if j not in wanted]
            removed += [v.job_id for v in self.supervisor.jobs() if v.state.active and v.job_id not in wanted]
        for job_id in dict.fromkeys(removed):
            gone = self.desired.pop(job_id, None)
            await self.supervisor.deallocate(job_id, [convert.gpu(g) for g in gone.gpus] if gone else [])
        for d in response.allocations:
            self.desired[d.job.job_id] = d
            try:
                await self.supervisor.allocate(convert.directive(d, self.roots))
            except (DirectiveError, ConflictError) as exc:
                log.warning("allocation_refused", attempt_id=d.attempt_id, job_id=d.job.job_id, error=str(exc))
                self.supervisor.events.append(d.job.job_id, EventKind.FAILED, attempt_id=d.attempt_id,
                                              message=f"directive {d.directive_id!r} {REFUSED}: {exc}")
