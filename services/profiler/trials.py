"""Trial runs through the executors.

`ExecutorTrials` finds the cluster through the registry (ListNodes for the
GPUs, ListClaims for what is taken), picks free GPUs of one kind packed on
the fewest nodes, and sends each node that hosts a rank a START directive
with the `profile` option (ExecutorService.StartJob). It follows every such
executor's WatchEvents from the seq it had before the start and waits for
PROFILED (from rank 0's node) and GPUS_RELEASED (from every node); FAILED
from any node makes the trial fail with that node's message. While not
enough GPUs are free (or a claim races with another job) it waits and
reports that through `on_wait`.

Every trial runs under a fresh job id (``<job>.prof-g<g>-<hex>``), so its
GPU claims never mix with the job's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import grpc

from omru.v1 import common_pb2, executor_pb2, executor_pb2_grpc, registry_pb2, registry_pb2_grpc
from services.common.channels import open_channel
from services.common.cluster import free_port
from services.common.logging import get_logger

log = get_logger(__name__)

#: Deadline of each unary call the profiler makes.
CALL_DEADLINE_S = 10.0


class TrialFailed(RuntimeError):
    """A trial run crashed or was refused; the message says why."""


@dataclass(frozen=True)
class NodeGpus:
    """One live node: its executor address and its GPU indices by kind."""

    node_id: str
    address: str
    gpus: tuple[tuple[int, str], ...]  # (index, kind)


@dataclass(frozen=True)
class ClusterShape:
    """The live nodes of the cluster."""

    nodes: tuple[NodeGpus, ...]

    def main_kind(self) -> str:
        """The GPU kind the cluster has most of ("" when it has none)."""
        kinds = Counter(kind for n in self.nodes for _, kind in n.gpus)
        return max(sorted(kinds), key=kinds.__getitem__) if kinds else ""

    def sizes(self, kind: str) -> list[int]:
        """GPUs of kind per node, largest first."""
        return sorted((sum(1 for _, k in n.gpus if k == kind) for n in self.nodes), reverse=True)

    def total(self, kind: str) -> int:
        return sum(self.sizes(kind))

    def nodes_for(self, gpus: int, kind: str) -> int:
        """Fewest nodes that hold gpus GPUs of kind (packed on the largest nodes)."""
        held, count = 0, 0
        for size in self.sizes(kind):
            if held >= gpus:
                break
            held, count = held + size, count + 1
        return count


def pick_free(shape: ClusterShape, kind: str, taken: set[tuple[str, int]], gpus: int) -> list[tuple[NodeGpus, int]] | None:
    """gpus free GPUs of kind on the fewest nodes (nodes with most free first), or None."""
    free = [(n, [i for i, k in n.gpus if k == kind and (n.node_id, i) not in taken]) for n in shape.nodes]
    free.sort(key=lambda item: (-len(item[1]), item[0].node_id))
    chosen: list[tuple[NodeGpus, int]] = []
    for node, indices in free:
        for i in indices:
            if len(chosen) == gpus:
                return chosen
            chosen.append((node, i))
    return chosen if len(chosen) == gpus else None


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured."""

    gpus: int
    nodes: int
    iter_seconds: float
    steps: int
    epoch_seconds: float  # as the worker measured it (whole epoch, or iter_seconds x steps)
    trial_id: str


class ExecutorTrials:
    """Runs profiling trials on the executors the registry knows."""

    def __init__(self, registry: str, token: str | None = None, warmup_iters: int = 3, measure_iters: int = 10,
                 trial_timeout_s: float = 600.0, poll_s: float = 0.5, tls=None) -> None:
        self.registry_address = registry
        self.token = token
        self.tls = tls  # TlsConfig of the channels to the registry and executors (None: plaintext)
        self.warmup_iters, self.measure_iters = warmup_iters, measure_iters
        self.trial_timeout_s, self.poll_s = trial_timeout_s, poll_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = open_channel(address, token=self.token, tls=self.tls)
        return self._channels[address]

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    @property
    def _registry(self) -> registry_pb2_grpc.RegistryServiceStub:
        return registry_pb2_grpc.RegistryServiceStub(self._channel(self.registry_address))

    async def shape(self) -> ClusterShape:
        """The live nodes and their GPUs."""
        reply = await self._registry.ListNodes(registry_pb2.ListNodesRequest(), timeout=CALL_DEADLINE_S)
        return ClusterShape(tuple(NodeGpus(n.node_id, n.address, tuple((g.index, g.kind) for g in n.gpus)) for n in reply.nodes))

    async def _taken(self) -> set[tuple[str, int]]:
        reply = await self._registry.ListClaims(registry_pb2.ListClaimsRequest(), timeout=CALL_DEADLINE_S)
        return {(c.gpu.node_id, c.gpu.index) for c in reply.claims}

    async def run(self, job: common_pb2.JobSpec, gpus: int, kind: str, full_epoch: bool,
                  on_wait: Callable[[str], None] = lambda message: None) -> TrialResult:
        """Measure job on gpus GPUs of kind; waits while they are busy. TrialFailed on a crash."""
        waited = False
        while True:
            shape = await self.shape()
            chosen = pick_free(shape, kind, await self._taken(), gpus)
            if chosen is not None:
                result = await self._attempt(job, chosen, full_epoch)
                if result is not None:
                    return result
                why = "another job claimed them first"
            else:
                why = f"fewer than {gpus} {kind} GPUs free"
            if not waited:
                on_wait(f"waiting for {gpus} free GPUs: {why}")
                waited = True
            await asyncio.sleep(self.poll_s)

    async def _attempt(self, job: common_pb2.JobSpec, chosen: Sequence[tuple[NodeGpus, int]], full_epoch: bool) -> TrialResult | None:
        """One trial on the chosen GPUs; None when a claim conflict refused it (retry later)."""
        gpus = len(chosen)
        trial_id = f"{job.job_id[:96]}.prof-g{gpus}-{uuid.uuid4().hex[:8]}"
        spec = common_pb2.JobSpec()
        spec.CopyFrom(job)
        spec.job_id = trial_id
        nodes: list[NodeGpus] = []
        for node, _ in chosen:
            if node not in nodes:
                nodes.append(node)
        rank0 = nodes[0]
        rendezvous = f"{rank0.address.rpartition(':')[0]}:{free_port()}" if len(nodes) > 1 else ""
        options = executor_pb2.ProfileOptions(warmup_iters=self.warmup_iters, measure_iters=self.measure_iters,
                                              full_epoch=full_epoch)
        directive = executor_pb2.Directive(
            directive_id=f"{trial_id}.start", kind=executor_pb2.DIRECTIVE_KIND_START, job=spec,
            gpus=[common_pb2.GpuRef(node_id=n.node_id, index=i) for n, i in chosen],
            rendezvous_endpoint=rendezvous, attempt_id=trial_id if len(nodes) > 1 else "", profile=options)
        stubs = {n.node_id: executor_pb2_grpc.ExecutorServiceStub(self._channel(n.address)) for n in nodes}
        watches = {}
        try:
            for node in nodes:  # follow each node's log from before the start: no event is missed
                last = (await stubs[node.node_id].GetJobs(executor_pb2.GetJobsRequest(), timeout=CALL_DEADLINE_S)).last_seq
                watches[node.node_id] = stubs[node.node_id].WatchEvents(executor_pb2.WatchEventsRequest(after_seq=last))
            started = []
            for node in nodes:
                try:
                    await stubs[node.node_id].StartJob(executor_pb2.StartJobRequest(directive=directive), timeout=CALL_DEADLINE_S)
                    started.append(node)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and not started:
                        log.info("trial_claim_conflict", trial_id=trial_id, details=exc.details())
                        return None
                    await self._stop(stubs, started, trial_id)
                    raise TrialFailed(f"executor {node.node_id} refused the trial on {gpus} GPUs: "
                                      f"{exc.code().name}: {exc.details()}") from None
            log.info("trial_started", trial_id=trial_id, gpus=gpus, nodes=[n.node_id for n in nodes])
            try:
                profiled = await asyncio.wait_for(self._outcome(trial_id, watches, rank0.node_id), self.trial_timeout_s)
            except asyncio.TimeoutError:
                await self._stop(stubs, started, trial_id)
                raise TrialFailed(f"trial {trial_id} on {gpus} GPUs did not finish within {self.trial_timeout_s:.0f} s") from None
        finally:
            for call in watches.values():
                call.cancel()
        return TrialResult(gpus=gpus, nodes=len(nodes), iter_seconds=profiled.iter_seconds, steps=profiled.steps,
                           epoch_seconds=profiled.epoch_seconds, trial_id=trial_id)

    async def _outcome(self, trial_id: str, watches: dict, rank0_node: str) -> executor_pb2.ExecutorEvent:
        """PROFILED once every node released its GPUs; TrialFailed on FAILED."""
        K = executor_pb2
        queue: asyncio.Queue = asyncio.Queue()

        async def follow(node_id: str, call) -> None:
            try:
                async for reply in call:
                    if reply.event.job_id == trial_id:
                        await queue.put(reply.event)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.CANCELLED:
                    await queue.put(TrialFailed(f"event stream of node {node_id} broke: {exc.code().name}: {exc.details()}"))

        tasks = [asyncio.ensure_future(follow(n, c)) for n, c in watches.items()]
        profiled, released = None, set()
        try:
            while profiled is None or released != set(watches):
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if item.kind == K.EXECUTOR_EVENT_KIND_FAILED:
                    raise TrialFailed(f"trial {trial_id} failed on node {item.node_id}: {item.message}")
                if item.kind == K.EXECUTOR_EVENT_KIND_PROFILED and item.node_id == rank0_node:
                    profiled = item
                elif item.kind == K.EXECUTOR_EVENT_KIND_GPUS_RELEASED:
                    released.add(item.node_id)
                    if profiled is None and item.node_id == rank0_node:
                        raise TrialFailed(f"trial {trial_id} released its GPUs without a measurement: {item.message}")
            return profiled
        finally:
            for t in tasks:
                t.cancel()

    async def _stop(self, stubs: dict, nodes: Sequence[NodeGpus], trial_id: str) -> None:
        for node in nodes:
            stop = executor_pb2.Directive(directive_id=f"{trial_id}.stop", kind=executor_pb2.DIRECTIVE_KIND_STOP,
                                          job=common_pb2.JobSpec(job_id=trial_id))
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stubs[node.node_id].StopJob(executor_pb2.StopJobRequest(directive=stop), timeout=CALL_DEADLINE_S)
