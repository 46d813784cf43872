"""Builders and helpers for the executor service tests: real executor servers
(in-process, port 0) registered in the test registry, driven as the planner
drives them (allocations and GPU claims written into etcd through
`PlannerState.change`, which each executor's AllocationWatch follows), tiny
job specs, an event collector over WatchEvents."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass

import grpc

from omru.v1 import common_pb2, executor_pb2, executor_pb2_grpc, registry_pb2_grpc
from services.common import config as cfg
from services.common.channels import open_channel
from tests.platform.platform_helpers import gpu, node_lease  # noqa: F401  (gpu: re-exported for the executor tests)

START = executor_pb2.DIRECTIVE_KIND_START
RESIZE = executor_pb2.DIRECTIVE_KIND_RESIZE
K = executor_pb2  # event kinds: K.EXECUTOR_EVENT_KIND_...


def tiny_job(job_id: str = "job-1", **overrides) -> common_pb2.JobSpec:
    """A job that trains in about a second per epoch on one CPU core."""
    fields = dict(job_id=job_id, model="mobilenet_v3_small", dataset="synthetic", epochs=3, batch_size=8,
                  base_lr=0.05, base_batch=8, warmup_epochs=0, momentum=0.9, num_classes=4, image_size=16,
                  train_samples=64, seed=7)
    fields.update(overrides)
    return common_pb2.JobSpec(**fields)


def directive(directive_id: str, kind: int, job: common_pb2.JobSpec, gpus=(), **fields) -> executor_pb2.Directive:
    return executor_pb2.Directive(directive_id=directive_id, kind=kind, job=job, gpus=list(gpus), **fields)


async def allocate(store, node_id: str, d: executor_pb2.Directive) -> None:
    """Write d as the node's allocation the way the planner does (`PlannerState.change`, one transaction),
    with the job's claims on d's GPUs of the node that no job holds yet, bound to the node's lease. (No
    planner runs here to give claims back when the executor releases its GPUs: a GPU another job held
    stays that job's.)"""
    from services.planner.state import PlannerState

    state = PlannerState(store)
    lease = await node_lease(store, node_id)
    held = await state.claims()
    gpus = {(g.node_id, g.index): lease for g in d.gpus if g.node_id == node_id and (g.node_id, g.index) not in held}
    result = await state.change(d.job.job_id, claim=gpus, put={node_id: (d.SerializeToString(deterministic=True), lease)})
    assert result.succeeded, result.existing


@dataclass
class Executor:
    """One in-process executor server, a stub to it, and the etcd the planner would write its allocations to."""

    node_id: str
    running: object
    channel: grpc.aio.Channel
    stub: executor_pb2_grpc.ExecutorServiceStub
    store: object = None  # EtcdStore

    async def start_job(self, d: executor_pb2.Directive) -> None:
        """d becomes this node's allocation (see `allocate`); the executor acts on it."""
        await allocate(self.store, self.node_id, d)

    resize_job = start_job  # (a new attempt's allocation replaces the old one)

    async def stop_job(self, job_id: str) -> None:
        """Remove the job's allocation of this node, as the planner stops a job there."""
        from services.planner.state import PlannerState

        assert (await PlannerState(self.store).change(job_id, drop=[self.node_id])).succeeded

    async def job(self, job_id: str) -> executor_pb2.ExecutorJob:
        jobs = (await self.stub.GetJobs(executor_pb2.GetJobsRequest(), timeout=10)).jobs
        return next(j for j in jobs if j.job_id == job_id)

    def events(self, after_seq: int = 0) -> "Events":
        return Events(self.stub.WatchEvents(executor_pb2.WatchEventsRequest(after_seq=after_seq)))


async def start_executor(registry_address: str, node_id: str, slots: int, work_dir, max_restarts: int = 2,
                         root=None, store=None) -> Executor:
    """An executor whose checkpoint root and only data root is `root` (default: work_dir's parent, the test's tmp_path)."""
    from services.executor import server

    root = root or work_dir.parent
    config = cfg.ExecutorConfig(node_id=node_id, registry=registry_address, slots=slots,
                                ttl_seconds=10, work_dir=work_dir, max_restarts=max_restarts,
                                checkpoint_root=root, data_roots=(root,))
    running, _membership = await server.start(config)
    channel = open_channel(running.address)
    return Executor(node_id, running, channel, executor_pb2_grpc.ExecutorServiceStub(channel), store)


@contextlib.asynccontextmanager
async def executors(registry_address: str, tmp_path, *shapes: tuple[str, int], max_restarts: int = 2, root=None,
                    store=None):
    """Executors for (node_id, slots) shapes (root: as for start_executor; store: the registry's etcd, for their
    allocations); stopped (workers killed, GPUs released) on exit."""
    started = []
    try:
        for node_id, slots in shapes:
            started.append(await start_executor(registry_address, node_id, slots, tmp_path / node_id, max_restarts,
                                                root, store))
        yield started
    finally:
        for e in reversed(started):
            await e.channel.close()
            await e.running.stop(0)


class Events:
    """Collects a WatchEvents stream in the background."""

    def __init__(self, call) -> None:
        self.call = call
        self.items: list[executor_pb2.ExecutorEvent] = []
        self._changed = asyncio.Event()
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            async for response in self.call:
                self.items.append(response.event)
                self._changed.set()

    async def wait_for(self, predicate, timeout: float = 120.0) -> executor_pb2.ExecutorEvent:
        """The first event (seen or still to come) for which predicate holds."""
        async def scan():
            seen = 0
            while True:
                for e in self.items[seen:]:
                    if predicate(e):
                        return e
                seen = len(self.items)
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(scan(), timeout)

    def of(self, job_id: str, kind: int | None = None) -> list[executor_pb2.ExecutorEvent]:
        return [e for e in self.items if e.job_id == job_id and (kind is None or e.kind == kind)]

    def close(self) -> None:
        self.call.cancel()
        self.task.cancel()


def is_event(job_id: str, kind: int, **fields):
    return lambda e: e.job_id == job_id and e.kind == kind and all(getattr(e, k) == v for k, v in fields.items())


def is_refusal_of(d: executor_pb2.Directive):
    """The FAILED event that reports the allocation d refused (services/executor/servicer.py `is_refusal`)."""
    return lambda e: e.kind == K.EXECUTOR_EVENT_KIND_FAILED and e.message.startswith(f"directive {d.directive_id!r} refused: ")


async def claims_of(registry_address: str, job_id: str) -> list[tuple[str, int]]:
    async with open_channel(registry_address) as channel:
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        from omru.v1 import registry_pb2

        response = await stub.ListClaims(registry_pb2.ListClaimsRequest(job_id=job_id), timeout=10)
    return sorted((c.gpu.node_id, c.gpu.index) for c in response.claims)


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
