"""Typed client SDK for the OMRU planner: `Client` (asyncio) and `SyncClient` (blocking).

    from omru import workload
    from omru.client import SyncClient

    with SyncClient("127.0.0.1:50051") as c:
        ids = c.submit(workload.load("examples/demo.yaml"))
        for update in c.watch(until_done=True):
            print(update.job_id, update.state, update.epochs_done)
        print([j.job_id for j in c.list_jobs(states=["FAILED"])])  # where jobs stand now, filtered by state
        print(c.report().makespan_s)
        for chunk in c.logs(ids[0], rank=0):  # what rank 0 printed (stdout and stderr), with node and attempt
            print(chunk.text, end="")

Every unary call has a deadline (`deadline_s`, default 10 s); watches run
until the caller stops them, ``timeout_s`` passes or, with ``until_done``,
every watched job is in a terminal state (each stream has a one-day deadline
and is reopened after it). `logs` reads a job's logs through the planner, which
asks the executor of every node that ran the job: `LogChunk`s (node, attempt,
rank, bytes), node after node; with ``follow`` as the ranks print, until
their attempts end or ``timeout_s`` passes (default 60 s, with follow a day).
Errors are the SDK's own (omru.errors): every method raises an `OmruError`
subclass of the status code the service answered with (`InvalidArgument`
names each bad value, `NotFound` an unknown job, `Unavailable` a planner that
cannot be reached), keeping the code (``code()``) and the service's words
(``details()``). `wait` blocks until jobs end (`WaitTimeout` when its time is
up), `nodes` lists the cluster's nodes (from the registry), `job` builds a
validated job. Against a planner serving TLS pass ``tls=TlsConfig(ca_file=...,
cert_file=..., key_file=...)`` (``from omru import TlsConfig``; the
certificate only for mutual TLS). docs/sdk.md has a complete example.

Without an address (``SyncClient()``) the client finds the planner as the
command line does: ``$OMRU_PLANNER``, else the context `omru up` wrote
(omru.context: ``$OMRU_CONTEXT`` or ``~/.config/omru/context.json``), else
127.0.0.1:50051; a token or TLS not given comes from ``$OMRU_AUTH_TOKEN`` /
``$OMRU_TLS_CA``... else from the context when the address is one it names
(`connect_options`).
"""

from __future__ import annotations

import asyncio
import math
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Iterable, Iterator, Mapping, Sequence

from omru import errors

TERMINAL = ("FINISHED", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class JobStatus:
    """Where one job stands (state is the omru.v1.JobState name without its prefix)."""

    job_id: str
    state: str
    epochs_done: int
    world_size: int
    accuracy: float
    plan_version: int
    revision: int
    message: str
    time_unix_s: float
    epochs: int = 0  # epochs the job trains in all
    owner: str = ""  # who submitted it (the caller's name when the cluster checks credentials)
    submitted_unix_s: float = 0.0  # when it was submitted (0: not known)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


@dataclass(frozen=True)
class PlannedSegment:
    job_id: str
    start_s: float
    end_s: float
    gpus: tuple[tuple[str, int], ...]
    epochs: float


@dataclass(frozen=True)
class PlanInfo:
    version: int
    policy: str
    makespan_s: float
    created_unix_s: float
    segments: tuple[PlannedSegment, ...]


@dataclass(frozen=True)
class JobResult:
    job_id: str
    state: str
    epochs_done: int
    accuracy: float
    planned_finish_s: float
    actual_finish_s: float
    gpu_seconds: float
    message: str = ""  # why it failed, where it did


@dataclass(frozen=True)
class ReportInfo:
    makespan_s: float
    planned_makespan_s: float
    utilisation: float
    policy: str
    gpus: int
    lower_bound_s: float
    jobs: tuple[JobResult, ...]


@dataclass(frozen=True)
class GpuSlot:
    """One GPU (or CPU slot) of a node and the job that holds it ("" when free)."""

    index: int
    kind: str
    memory_bytes: int
    job_id: str


@dataclass(frozen=True)
class NodeInfo:
    """A live node: its executor's address, its GPUs and their holders, when it registered, its lease's TTL."""

    node_id: str
    address: str
    gpus: tuple[GpuSlot, ...]
    registered_unix_s: float
    ttl_seconds: int


@dataclass(frozen=True)
class LogChunk:
    """Bytes one rank of a job printed (stdout and stderr, in the order they came), on one node.

    ``attempt`` numbers the job's attempts on that node (1 = the first; each
    restart and resize is a new one); ``attempt_id`` is the attempt's id."""

    node_id: str
    attempt: int
    attempt_id: str
    rank: int
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")


#: Deadline of `Client.logs` without follow, and with follow (seconds), unless timeout_s is given.
LOGS_DEADLINE_S = 60.0
FOLLOW_DEADLINE_S = 24 * 3600.0


def _state(value: int) -> str:
    from omru.v1 import common_pb2

    return common_pb2.JobState.Name(value).removeprefix("JOB_STATE_")


def _state_value(state: str | int) -> int:
    """omru.v1.JobState value of a state name (with or without JOB_STATE_, any case) or value."""
    from omru.v1 import common_pb2

    if isinstance(state, int):
        return state
    name = state.upper()
    name = name if name.startswith("JOB_STATE_") else f"JOB_STATE_{name}"
    if name == "JOB_STATE_UNSPECIFIED" or name not in common_pb2.JobState.keys():
        known = ", ".join(n.removeprefix("JOB_STATE_") for n in common_pb2.JobState.keys()[1:])
        raise errors.InvalidArgument(f"unknown job state {state!r}; known: {known}")
    return common_pb2.JobState.Value(name)


def _status(u) -> JobStatus:
    return JobStatus(u.job_id, _state(u.state), u.epochs_done, u.world_size, u.accuracy, u.plan_version, u.revision,
                     u.message, u.time_unix_s, u.epochs, u.owner, u.submitted_unix_s)


def _plan(p) -> PlanInfo:
    return PlanInfo(p.version, p.policy, p.makespan_s, p.created_unix_s, tuple(
        PlannedSegment(s.job_id, s.start_s, s.end_s, tuple((g.node_id, g.index) for g in s.gpus), s.epochs)
        for s in p.segments))


def _report(r) -> ReportInfo:
    return ReportInfo(r.makespan_s, r.planned_makespan_s, r.utilisation, r.policy, r.gpus, r.lower_bound_s, tuple(
        JobResult(j.job_id, _state(j.state), j.epochs_done, j.accuracy, j.planned_finish_s, j.actual_finish_s,
                  j.gpu_seconds, j.message) for j in r.jobs))


def _requests(jobs, policy: str):
    """A SubmitJobsRequest from a Workload, WorkloadJobs (`job`) or JobSpec protos."""
    from omru.v1 import common_pb2, planner_pb2
    from omru.workload import Workload, WorkloadJob

    if isinstance(jobs, Workload):
        policy = policy or jobs.policy
        jobs = jobs.jobs
    if isinstance(jobs, (WorkloadJob, common_pb2.JobSpec)):
        jobs = [jobs]
    if isinstance(jobs, (str, bytes)) or not isinstance(jobs, Iterable):
        raise errors.InvalidArgument(f"jobs: {jobs!r} is not a job or a list of jobs")
    specs, hints = [], []
    for i, j in enumerate(jobs):
        if isinstance(j, common_pb2.JobSpec):
            specs.append(j)
            continue
        if not isinstance(j, WorkloadJob):
            raise errors.InvalidArgument(f"jobs[{i}]: {j!r} is not a job (omru.client.job, a WorkloadJob or a JobSpec)")
        from services.planner import convert  # (here: JobSpecs alone need none of the planner's modules)

        try:
            specs.append(convert.job_spec(j))
        except ValueError as exc:  # (SpecError: what a JobSpec cannot carry, named)
            raise errors.InvalidArgument(f"job {j.id!r}: {exc}") from None
        if j.profile:
            hints.append(planner_pb2.JobProfile(job_id=j.id, epoch_seconds=dict(j.profile)))
    req = planner_pb2.SubmitJobsRequest(jobs=specs, policy=policy)
    if hints:
        req.profiles.extend(hints)
    return req


def job(job_id: str, *, epochs: int, model: str | None = None, dataset: str | None = None,
        command: Sequence[str] | None = None, workdir: str | None = None, env: Mapping[str, str] | None = None,
        batch_size: int | None = None, base_lr: float | None = None, base_batch: int | None = None,
        min_gpus: int | None = None, max_gpus: int | None = None, profile: Mapping[int, float] | None = None,
        **fields):
    """A validated job to `submit` (an omru.workload.WorkloadJob): a model of the zoo (model, dataset) or
    your own script (command, workdir, env), with the fields of a workload file (omru/workload.py;
    unset: their defaults; ``fields``: the others, such as image_size, seed, train_samples).

    Raises `errors.InvalidArgument` naming every bad value (and any unknown field)."""
    from omru import workload

    named = dict(epochs=epochs, model=model, dataset=dataset, command=None if command is None else list(command),
                 workdir=workdir, env=None if env is None else dict(env), batch_size=batch_size, base_lr=base_lr,
                 base_batch=base_batch, min_gpus=min_gpus, max_gpus=max_gpus,
                 profile=None if profile is None else dict(profile))
    raw = {"id": job_id, **{k: v for k, v in named.items() if v is not None}, **fields}
    try:
        return workload.from_dict({"jobs": [raw]}, source=f"job {job_id!r}").jobs[0]
    except workload.WorkloadError as exc:
        raise errors.InvalidArgument("; ".join(exc.problems)) from None


async def node_listing(stub, timeout_s: float):
    """(ListNodesResponse, (node_id, index) -> the job holding that GPU) from a RegistryService stub."""
    from omru.v1 import registry_pb2

    nodes = await stub.ListNodes(registry_pb2.ListNodesRequest(), timeout=timeout_s)
    claims = await stub.ListClaims(registry_pb2.ListClaimsRequest(), timeout=timeout_s)
    return nodes, {(c.gpu.node_id, c.gpu.index): c.job_id for c in claims.claims}


def _ids(job_ids: str | Iterable[str]) -> list[str]:
    """job ids as a list (one id alone is one job); InvalidArgument when none is given or one is not a string."""
    ids = [job_ids] if isinstance(job_ids, str) else list(job_ids)
    if not ids:
        raise errors.InvalidArgument("job_ids: no job id given")
    for i, j in enumerate(ids):
        if not isinstance(j, str) or not j:
            raise errors.InvalidArgument(f"job_ids[{i}]: {j!r} is not a job id")
    return ids


def _seconds(name: str, value: float | None, required: bool = False) -> float | None:
    """A time limit: None (none, unless required) or a finite number > 0, else InvalidArgument naming it."""
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise errors.InvalidArgument(f"{name}: {value!r} is not a number of seconds > 0")
    return float(value)


def connect_options(address: str | None = None, token: str | None = None, tls=None, service: str = "planner"):
    """(address, token, tls) to reach `service`: what is given, else the environment, else the context
    `omru up` wrote, else (the planner) 127.0.0.1:50051 (see omru.context.resolve). tls: a TlsConfig or None."""
    from pathlib import Path

    from omru import context

    try:
        conn = context.resolve(service, address, token,
                               default=context.DEFAULT_PLANNER if service == "planner" else None)
    except context.ContextError as exc:
        raise errors.InvalidArgument(f"{exc} (fix or remove it, or set ${context.ENV})") from None
    if conn.address is None:
        raise errors.Unavailable(f"no {service} address: pass one, set ${context.ADDRESS_ENV[service]}, or start "
                                 f"a cluster with `omru up` (context {context.path()})")
    if tls is None and (conn.tls_ca or conn.tls_cert or conn.tls_key):
        from services.common.config import TlsConfig

        tls = TlsConfig(*(Path(p) if p else None for p in (conn.tls_cert, conn.tls_key, conn.tls_ca)))
    return conn.address, conn.token, tls


class Client:
    """Asyncio client of PlannerService (use as ``async with Client(addr) as c``; no address: `connect_options`).

    registry: the registry's address for `nodes` (default: $OMRU_REGISTRY, else the context's); it gets
    the same token and TLS as the planner."""

    def __init__(self, address: str | None = None, token: str | None = None, deadline_s: float = 10.0, tls=None,
                 registry: str | None = None) -> None:
        self.deadline_s = _seconds("deadline_s", deadline_s, required=True)
        address, token, tls = connect_options(address, token, tls)
        self.address = address
        self.token = token
        self.tls = tls  # a TlsConfig (from omru import TlsConfig): CA (and client certificate for mutual TLS)
        self.registry = registry
        self._channel = None
        self._stub = None
        self._registry_channel = None

    async def __aenter__(self) -> "Client":
        from omru.v1 import planner_pb2_grpc
        from services.common.channels import open_channel

        self._channel = open_channel(self.address, token=self.token, tls=self.tls, deadline=self.deadline_s)
        self._stub = planner_pb2_grpc.PlannerServiceStub(self._channel)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in (self._channel, self._registry_channel):
            if channel is not None:
                await channel.close()
        self._channel = self._registry_channel = self._stub = None

    @property
    def _planner(self):
        if self._stub is None:
            raise RuntimeError("the client is not open: use `async with Client(...) as c` (or SyncClient)")
        return self._stub

    async def _call(self, method: str, request, stub=None):
        """A unary call with the client's deadline; an RpcError becomes the SDK's error."""
        import grpc

        try:
            return await getattr(stub or self._planner, method)(request, timeout=self.deadline_s)
        except grpc.RpcError as exc:
            raise errors.from_rpc(exc, self.address if stub is None else self.registry) from exc

    async def submit(self, jobs, policy: str = "") -> list[str]:
        """Submit a `Workload`, or jobs (`job`, WorkloadJobs, JobSpecs; one alone or a list); returns the job ids."""
        return list((await self._call("SubmitJobs", _requests(jobs, policy))).job_ids)

    async def cancel(self, job_id: str) -> str:
        """Cancel a job (its workers stop, its GPUs go to other jobs); its state then (CANCELLED, or the
        terminal state it already had). NotFound for an unknown job."""
        from omru.v1 import planner_pb2

        return _state((await self._call("CancelJob", planner_pb2.CancelJobRequest(job_id=job_id))).state)

    async def plan(self) -> PlanInfo:
        from omru.v1 import planner_pb2

        return _plan((await self._call("GetPlan", planner_pb2.GetPlanRequest())).plan)

    async def report(self) -> ReportInfo:
        return _report(await self.report_proto())

    async def report_proto(self):
        """The raw omru.v1.Report (for tools that draw it)."""
        from omru.v1 import planner_pb2

        return (await self._call("GetReport", planner_pb2.GetReportRequest())).report

    async def list_jobs(self, states: Sequence[str | int] = (), job_ids: Sequence[str] = ()) -> list[JobStatus]:
        """Every job where it stands now, by job_id (PlannerService.ListJobs; a standby planner answers too).

        states: only jobs in these states, by name ("RUNNING", "running" or "JOB_STATE_RUNNING") or
        omru.v1.JobState value (InvalidArgument naming an unknown name or value); job_ids: only these
        jobs. Empty: no filter."""
        from omru.v1 import planner_pb2

        request = planner_pb2.ListJobsRequest(states=[_state_value(x) for x in states], job_ids=list(job_ids))
        return [_status(u) for u in (await self._call("ListJobs", request)).jobs]

    async def status(self) -> list[JobStatus]:
        """The current state of every job, by job_id (`list_jobs` without filters)."""
        return await self.list_jobs()

    async def wait(self, job_ids: str | Iterable[str], timeout: float | None = None) -> dict[str, JobStatus]:
        """Block until every job named is FINISHED, FAILED or CANCELLED; their final states, by job id in
        the order given. NotFound names the jobs the planner does not know; `errors.WaitTimeout` (with
        the last states seen) when ``timeout`` seconds pass first (None: no limit)."""
        ids = _ids(job_ids)
        timeout = _seconds("timeout", timeout)
        loop = asyncio.get_running_loop()
        began = loop.time()
        known = {j.job_id: j for j in await self.list_jobs(job_ids=ids)}
        missing = [j for j in ids if j not in known]
        if missing:
            raise errors.NotFound(f"no job {', '.join(map(repr, missing))} on the planner", address=self.address)
        latest: dict[str, JobStatus] = dict(known)
        if not all(s.done for s in latest.values()):
            left = None if timeout is None else max(1e-3, timeout - (loop.time() - began))
            async for s in self.watch(ids, until_done=True, timeout_s=left):
                latest[s.job_id] = s
        if all(latest[j].done for j in ids):
            return {j: latest[j] for j in ids}
        running = ", ".join(f"{j} {latest[j].state}" for j in ids if not latest[j].done)
        raise errors.WaitTimeout(f"jobs not done within {timeout} s: {running}", {j: latest[j] for j in ids},
                                 address=self.address)

    async def nodes(self) -> list[NodeInfo]:
        """Every live node of the cluster, its GPUs and which job holds each (RegistryService.ListNodes
        and ListClaims, at the client's registry: see the class)."""
        from omru.v1 import registry_pb2_grpc
        from services.common.channels import open_channel

        if self._registry_channel is None:
            self._planner  # (open first)
            self.registry, _, _ = connect_options(self.registry, self.token, self.tls, service="registry")
            self._registry_channel = open_channel(self.registry, token=self.token, tls=self.tls,
                                                  deadline=self.deadline_s)
        import grpc

        try:
            nodes, holder = await node_listing(registry_pb2_grpc.RegistryServiceStub(self._registry_channel),
                                               self.deadline_s)
        except grpc.RpcError as exc:
            raise errors.from_rpc(exc, self.registry) from exc
        return [NodeInfo(n.node_id, n.address, tuple(GpuSlot(g.index, g.kind, g.memory_bytes,
                                                             holder.get((n.node_id, g.index), "")) for g in n.gpus),
                         n.registered_unix_s, n.ttl_seconds) for n in nodes.nodes]

    async def logs(self, job_id: str, rank: int | None = None, attempt: int = 0, follow: bool = False,
                   timeout_s: float | None = None) -> AsyncIterator[LogChunk]:
        """What the job's ranks printed, from every node that ran it (see the module docstring).

        rank: only that rank (None: every rank); attempt: the Nth attempt on
        each node (0: the newest). With follow, the end of timeout_s ends the
        iteration quietly. NotFound for an unknown job or one no node has logs
        of, InvalidArgument naming a bad value."""
        import grpc

        from omru.v1 import planner_pb2

        timeout_s = _seconds("timeout_s", timeout_s)
        request = planner_pb2.GetJobLogsRequest(job_id=job_id, attempt=attempt, follow=follow)
        if rank is not None:
            request.rank = rank
        call = self._planner.GetJobLogs(request, timeout=timeout_s or (FOLLOW_DEADLINE_S if follow else LOGS_DEADLINE_S))
        try:
            async for c in call:
                yield LogChunk(c.node_id, c.attempt, c.attempt_id, c.rank, c.data)
        except grpc.RpcError as exc:
            if not (follow and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
                raise errors.from_rpc(exc, self.address) from exc
        finally:
            call.cancel()

    def _watch_call(self, job_ids: Sequence[str], after_revision: int, timeout_s: float):
        from omru.v1 import planner_pb2

        return self._planner.WatchJobs(planner_pb2.WatchJobsRequest(after_revision=after_revision,
                                                                    job_ids=list(job_ids)), timeout=timeout_s)

    async def watch(self, job_ids: Sequence[str] = (), after_revision: int = 0, until_done: bool = False,
                    timeout_s: float | None = None) -> AsyncIterator[JobStatus]:
        """Job updates: the current state first, then live; reconnects after a broken stream (and after
        each stream's deadline, a day, when there is no timeout_s). The end of timeout_s ends it quietly."""
        import grpc

        timeout_s = _seconds("timeout_s", timeout_s)
        latest: dict[str, JobStatus] = {}
        loop = asyncio.get_running_loop()
        end = None if timeout_s is None else loop.time() + timeout_s
        while True:
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return
            call = self._watch_call(job_ids, after_revision, FOLLOW_DEADLINE_S if left is None else left + 5.0)
            try:
                while True:
                    left = None if end is None else end - loop.time()
                    if left is not None and left <= 0:
                        return
                    try:
                        reply = await asyncio.wait_for(call.read(), timeout=left)
                    except asyncio.TimeoutError:
                        return
                    if reply is grpc.aio.EOF:
                        break
                    s = _status(reply.update)
                    after_revision = max(after_revision, s.revision)
                    latest[s.job_id] = s
                    yield s
                    if until_done and latest and all(x.done for x in latest.values()) and \
                            (not job_ids or set(job_ids) <= set(latest)):
                        return
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise errors.from_rpc(exc, self.address) from exc
                await asyncio.sleep(0.5)
            finally:
                call.cancel()


class SyncClient:
    """Blocking wrapper of `Client` (its own event loop on a daemon thread)."""

    def __init__(self, address: str | None = None, token: str | None = None, deadline_s: float = 10.0, tls=None,
                 registry: str | None = None) -> None:
        # resolves the address first
        self._client = Client(address, token=token, deadline_s=deadline_s, tls=tls, registry=registry)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="omru-client", daemon=True)
        self._thread.start()
        self._run(self._client.__aenter__())

    @property
    def address(self) -> str:
        return self._client.address

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def submit(self, jobs, policy: str = "") -> list[str]:
        return self._run(self._client.submit(jobs, policy))

    def cancel(self, job_id: str) -> str:
        return self._run(self._client.cancel(job_id))

    def plan(self) -> PlanInfo:
        return self._run(self._client.plan())

    def report(self) -> ReportInfo:
        return self._run(self._client.report())

    def report_proto(self):
        return self._run(self._client.report_proto())

    def list_jobs(self, states: Sequence[str | int] = (), job_ids: Sequence[str] = ()) -> list[JobStatus]:
        """`Client.list_jobs`, blocking."""
        return self._run(self._client.list_jobs(states, job_ids))

    def status(self) -> list[JobStatus]:
        return self._run(self._client.status())

    def wait(self, job_ids: str | Iterable[str], timeout: float | None = None) -> dict[str, JobStatus]:
        """`Client.wait`, blocking."""
        return self._run(self._client.wait(job_ids, timeout))

    def nodes(self) -> list[NodeInfo]:
        """`Client.nodes`, blocking."""
        return self._run(self._client.nodes())

    def watch(self, job_ids: Sequence[str] = (), after_revision: int = 0, until_done: bool = False,
              timeout_s: float | None = None) -> Iterator[JobStatus]:
        return self._iterate(self._client.watch(job_ids, after_revision, until_done, timeout_s))

    def logs(self, job_id: str, rank: int | None = None, attempt: int = 0, follow: bool = False,
             timeout_s: float | None = None) -> Iterator[LogChunk]:
        """`Client.logs`, blocking."""
        return self._iterate(self._client.logs(job_id, rank, attempt, follow, timeout_s))

    def _iterate(self, agen):
        try:
            while True:
                try:
                    yield self._run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._run(agen.aclose())


__all__ = ["Client", "SyncClient", "job", "connect_options", "JobStatus", "PlanInfo", "ReportInfo", "JobResult",
           "PlannedSegment", "LogChunk", "NodeInfo", "GpuSlot", "TERMINAL"]
