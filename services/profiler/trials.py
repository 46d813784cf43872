"""Trial runs through the planner.

`PlannerTrials` asks the leading planner for each trial
(PlannerService.RunTrial): the planner is the one writer of GPU ownership,
so it queues the trial until enough GPUs of the kind are free, claims them
on the fewest nodes and allocates the trial to their executors like any
other attempt (services/planner/trials.py), and answers with what rank 0
measured once every node released its GPUs. The profiler finds the planner
through its leader key in etcd (the leader's identity, "<host:port> pid N",
names the address it serves on), asked again when a planner answers that it
is on standby or cannot be reached. The cluster's shape (its nodes and GPU
kinds, for the profiler's checks and estimates) is read from the registry
(ListNodes); whether a trial waits for GPUs, for the QUEUED progress, from
its claims (ListClaims). Nothing here writes GPU ownership.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Callable

import grpc

from omru.v1 import common_pb2, executor_pb2, planner_pb2, planner_pb2_grpc, registry_pb2, registry_pb2_grpc
from services.common.channels import open_channel
from services.common.gpus import most_common_kind
from services.common.logging import get_logger

log = get_logger(__name__)

#: Deadline of each unary call the profiler makes (but RunTrial, which has the trial timeout).
CALL_DEADLINE_S = 10.0
#: Seconds between looks for a leading planner when there is none (being elected, not started yet).
LEADER_POLL_S = 0.5


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
        return most_common_kind(kind for n in self.nodes for _, kind in n.gpus)

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


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured."""

    gpus: int
    nodes: int
    iter_seconds: float
    steps: int
    epoch_seconds: float  # as the worker measured it (whole epoch, or iter_seconds x steps)
    trial_id: str


def leader_address(identity: str) -> str:
    """host:port of a planner leader's identity "<host:port> pid N" ("" for none)."""
    return identity.rsplit(" pid ", 1)[0].strip() if identity else ""


class PlannerTrials:
    """Runs profiling trials through the leading planner (RunTrial)."""

    def __init__(self, etcd, registry: str, token: str | None = None, warmup_iters: int = 3, measure_iters: int = 10,
                 trial_timeout_s: float = 600.0, tls=None, wait_check_s: float = 1.0) -> None:
        """etcd: the EtcdStore the planner's leader key is read from; registry: the registry's address."""
        self.etcd = etcd
        self.registry_address = registry
        self.token = token
        self.tls = tls  # TlsConfig of the channels to the registry and planner (None: plaintext)
        self.warmup_iters, self.measure_iters = warmup_iters, measure_iters
        self.trial_timeout_s, self.wait_check_s = trial_timeout_s, wait_check_s
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

    async def planner(self) -> str:
        """The leading planner's address ("" when none leads now)."""
        from services.planner.state import LEADER

        kv = await self.etcd.get(LEADER)
        return leader_address(kv.value.decode()) if kv is not None else ""

    async def _waits(self, job_id: str, gpus: int, kind: str) -> int | None:
        """GPUs of kind free now when the trial of job_id on gpus GPUs holds no claim yet and fewer than
        gpus are free (it waits for them); else None."""
        shape, claims = await asyncio.gather(
            self.shape(), self._registry.ListClaims(registry_pb2.ListClaimsRequest(), timeout=CALL_DEADLINE_S))
        if any(c.job_id.startswith(f"{job_id[:96]}.prof-g{gpus}-") for c in claims.claims):
            return None  # it runs
        taken = {(c.gpu.node_id, c.gpu.index) for c in claims.claims}
        free = sum(1 for n in shape.nodes for i, k in n.gpus if k == kind and (n.node_id, i) not in taken)
        return free if free < gpus else None

    async def run(self, job: common_pb2.JobSpec, gpus: int, kind: str, full_epoch: bool,
                  on_wait: Callable[[str], None] = lambda message: None) -> TrialResult:
        """Measure job on gpus GPUs of kind (the planner queues it while they are busy; on_wait says so).
        TrialFailed when it crashed, was refused or did not finish within the trial timeout."""
        options = executor_pb2.ProfileOptions(warmup_iters=self.warmup_iters, measure_iters=self.measure_iters,
                                              full_epoch=full_epoch)
        request = planner_pb2.RunTrialRequest(job=job, gpus=gpus, gpu_kind=kind, profile=options)
        deadline = time.monotonic() + self.trial_timeout_s
        call = asyncio.ensure_future(self._call(request, deadline))
        try:
            done, _ = await asyncio.wait({call}, timeout=self.wait_check_s)
            if not done:  # still under way: say so when it waits for GPUs
                with contextlib.suppress(grpc.aio.AioRpcError):
                    free = await self._waits(job.job_id, gpus, kind)
                    if free is not None and not call.done():
                        on_wait(f"waiting for {gpus} free GPUs: {free} {kind} GPUs are free")
            reply = await call
        finally:
            call.cancel()
        return TrialResult(gpus=reply.gpus, nodes=reply.nodes, iter_seconds=reply.iter_seconds, steps=reply.steps,
                           epoch_seconds=reply.epoch_seconds, trial_id=reply.trial_id)

    async def _call(self, request: planner_pb2.RunTrialRequest, deadline: float) -> planner_pb2.RunTrialResponse:
        """RunTrial on the leading planner, asked again (a new leader looked up) while none answers."""
        gpus = request.gpus
        last = "no planner leads"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TrialFailed(f"trial on {gpus} GPUs did not finish within {self.trial_timeout_s:.0f} s ({last})")
            address = await self.planner()
            if not address:
                await asyncio.sleep(min(LEADER_POLL_S, left))
                continue
            stub = planner_pb2_grpc.PlannerServiceStub(self._channel(address))
            try:
                return await stub.RunTrial(request, timeout=left)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNAVAILABLE:  # a standby, or a leader gone: look it up again
                    last = f"planner {address}: {exc.details()}"
                    log.info("trial_retry", planner=address, details=exc.details())
                    await asyncio.sleep(min(LEADER_POLL_S, max(deadline - time.monotonic(), 0)))
                    continue
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise TrialFailed(f"trial on {gpus} GPUs did not finish within {self.trial_timeout_s:.0f} s: "
                                      f"{exc.details()}") from None
                raise TrialFailed(f"the planner refused or failed the trial on {gpus} GPUs: {code.name}: "
                                  f"{exc.details()}") from None
