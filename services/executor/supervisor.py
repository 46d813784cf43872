"""The jobs of one executor node: allocations in, worker processes and events out.

`Supervisor` keeps, per job, the local part of its current attempt (the
ranks whose GPU lives on this node), starts them with
`services.executor.worker.launch.WorkerGroup`, turns the workers' JSON records
into `Event`s of an in-memory, monotonic `EventLog`, and decides what to do
when the workers exit. Deciding is the pure function `decide`; doing it is
`Supervisor._after_exit`.

A job may span executors: each executor starts only its own ranks; rank 0
hosts the c10d TCPStore at the allocation's rendezvous endpoint; every rank of
an attempt uses the store under the prefix ``attempt_id`` (restart n after a
worker failure uses the prefix ``<attempt_id>.r<n>``; events and GetJobs keep
naming the directive's ``attempt_id``), and all ranks share the checkpoint
folder. Only the node that hosts rank 0 sees the per-epoch
records, so only it emits EPOCH_DONE, FINISHED and PROFILED; every node
emits STARTED, GPUS_RELEASED and FAILED for its own ranks.

The node's allocations (written by the planner, which alone claims and
releases the GPUs; services/executor/servicer.py `AllocationWatch` follows
them), one change at a time:

allocate    (idempotent on directive_id and on the attempt) a job not
            running here starts; a job running another attempt moves: the
            workers stop at the end of the current epoch (they checkpoint
            first), the GPUs not in the new set are released (GPUS_RELEASED,
            which also names the GPUs the old attempt hands to the new one)
            and the new attempt starts from the checkpoint. A node with no
            rank in the new set stops its ranks and releases all its GPUs; a
            node with no rank in the old set starts its new ranks at once
            (they wait in the rendezvous for the others).
deallocate  the workers stop at the end of the current epoch, release.

A stop or move of an attempt with ranks on a node the registry no longer
lists terminates the local workers at once (that epoch cannot finish).

A worker that dies makes the others stop (`WorkerGroup`); the job restarts
from the newest checkpoint (so at most the epoch in progress is lost) up to
``max_restarts`` times, then fails; it fails at once when the failure is the
same as the last one and no epoch finished in between (retrying would only
repeat it). The FAILED event says why: the rank, its exit code and the last
lines of its stderr. What each rank prints is kept per attempt under
``<work_dir>/logs`` (services/executor/logs.py).

A script job (its own command instead of a model of the zoo) runs the same
way; as the executor sees only its exit when it does not use omru.elastic,
it counts as STARTED once its processes run and as FINISHED when they all
exit 0, and a stop or resize terminates it (it resumes from its own
checkpoint). A bad allocation raises `DirectiveError` (field + problem) or
`ConflictError` before anything changes (the servicer reports it as a FAILED
event).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Protocol, Sequence

from omru import lease
from services.common.logging import get_logger
from services.executor.logs import Chunk, LogStore
from services.executor.state import JobState, check_move
from services.executor.worker.launch import LaunchResult, WorkerGroup, free_port, worker_env
from services.executor.worker.warm import WarmPool
from services.executor.worker.spec import AttemptSpec, ProfileSpec, TrainSpec

log = get_logger(__name__)

#: Directive ids remembered for idempotency (oldest forgotten first).
SEEN_DIRECTIVES = 10_000
#: How the STOPPED message (and its GPUS_RELEASED note) begins when the node itself ended an allocated
#: attempt (its lease lapsed, it shuts down): the planner then requeues the job (`is_self_stop`).
SELF_STOP = "its node stopped it"


def is_self_stop(message: str) -> bool:
    """True for the message of an attempt its node ended on its own, not on a directive."""
    return message.startswith(SELF_STOP + ": ")


# --- data ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One GPU (or CPU slot) of the cluster."""

    node_id: str
    index: int

    def __str__(self) -> str:
        return f"{self.node_id}:{self.index}"


@dataclass(frozen=True)
class Directive:
    """The attempt of one job a node's allocation names (see executor.proto Directive).

    rendezvous "" = this executor picks a free local port at every launch
    (only for jobs whose ranks all live here); "host:0" = rank 0 binds a port
    of its choice and publishes it in checkpoint_dir (AttemptSpec); attempt_id "" = a fresh one;
    checkpoint_dir "" = the executor's own folder for the job.
    """

    directive_id: str
    job_id: str
    spec: TrainSpec
    gpus: tuple[Gpu, ...] = ()
    rendezvous: str = ""
    attempt_id: str = ""
    checkpoint_dir: str = ""
    profile: ProfileSpec | None = None


class EventKind(str, enum.Enum):
    STARTED = "started"
    EPOCH_DONE = "epoch_done"
    FINISHED = "finished"
    GPUS_RELEASED = "gpus_released"
    FAILED = "failed"
    PROFILED = "profiled"


@dataclass(frozen=True)
class Event:
    """One entry of the event log (fields as in executor.proto ExecutorEvent).

    STARTED: epoch = epochs already done (the resume point), restarts so far.
    EPOCH_DONE: epoch (1-based), epoch_seconds, loss, accuracy, lr, steps.
    FINISHED: epoch = epochs, accuracy, loss. PROFILED: iter_seconds,
    epoch_seconds, steps. GPUS_RELEASED: gpus = the GPUs given back.
    """

    seq: int
    node_id: str
    job_id: str
    kind: EventKind
    time_unix_s: float
    attempt_id: str = ""
    epoch: int = 0
    epoch_seconds: float = 0.0
    loss: float = 0.0
    accuracy: float = 0.0
    lr: float = 0.0
    world_size: int = 0
    gpus: tuple[Gpu, ...] = ()
    message: str = ""
    iter_seconds: float = 0.0
    steps: int = 0
    global_batch: int = 0
    restarts: int = 0


@dataclass(frozen=True)
class JobView:
    """A job as this executor sees it (GetJobs)."""

    job_id: str
    state: JobState
    attempt_id: str
    local_gpus: tuple[Gpu, ...]
    world_size: int
    epochs_done: int
    restarts: int
    profile: bool
    worker_pids: tuple[int, ...]
    message: str


class DirectiveError(ValueError):
    """A directive that is wrong in itself; ``field`` names the bad field."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name


class ConflictError(RuntimeError):
    """An allocation that clashes with what runs here (GPU held by another job, a trial moved)."""


class Runtime(Protocol):
    """What runs an attempt's local ranks: worker processes (`WorkerProcesses`), or emulated ones
    (services/executor/emulated.py) that keep the same record stream and checkpoint folder."""

    def group(self, spec: TrainSpec, attempt: AttemptSpec, ranks: Sequence[int], on_record, log_dir: Path) -> WorkerGroup:
        """The local ranks of one attempt, not started yet; what they print goes to log_dir."""

    def checkpoint_problem(self, spec: TrainSpec, checkpoint_dir: str) -> str:
        """Why the newest checkpoint in the folder cannot resume `spec` ("" when it can or there is none)."""


@dataclass
class WorkerProcesses:
    """The real runtime: one `python -m services.executor.worker` process per rank."""

    python: str = sys.executable
    grace_s: float = 5.0
    pool: WarmPool | None = None

    def group(self, spec, attempt, ranks, on_record, log_dir) -> WorkerGroup:
        return WorkerGroup(spec, attempt, ranks, on_record=on_record, python=self.python, grace_s=self.grace_s,
                           pool=self.pool, log_dir=log_dir)

    def checkpoint_problem(self, spec: TrainSpec, checkpoint_dir: str) -> str:
        from omru import checkpoint  # loads torch: callers run this in a thread

        if spec.is_script:  # the folder holds what the script writes
            return ""
        newest = checkpoint.latest(checkpoint_dir)
        try:
            if newest is not None:
                checkpoint.load(newest, spec.model, spec.fingerprint())
        except checkpoint.CheckpointError as exc:
            return str(exc)
        return ""


class Nodes(Protocol):
    """The nodes of the cluster (the registry)."""

    async def nodes(self) -> set[str]:
        """Ids of the nodes alive now (their lease holds)."""


# --- the event log ---------------------------------------------------------------------


class EventLog:
    """In-memory, append-only log with seq 1, 2, 3, ...; `follow` replays then waits."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._events: list[Event] = []
        self._changed = asyncio.Event()

    @property
    def last_seq(self) -> int:
        return len(self._events)

    def append(self, job_id: str, kind: EventKind, **fields) -> Event:
        event = Event(seq=len(self._events) + 1, node_id=self.node_id, job_id=job_id, kind=kind,
                      time_unix_s=time.time(), **fields)
        self._events.append(event)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        # an epoch's progress is kept here and sent to the planner; the service log keeps the changes
        (log.debug if kind is EventKind.EPOCH_DONE else log.info)(
            "executor_event", job_id=job_id, kind=kind.value, seq=event.seq, attempt_id=event.attempt_id,
            epoch=event.epoch, message=event.message)
        return event

    def since(self, after_seq: int) -> list[Event]:
        return self._events[max(after_seq, 0):]

    async def follow(self, after_seq: int = 0) -> AsyncIterator[Event]:
        """Every event with seq > after_seq, then each new one as it comes (forever)."""
        position = max(after_seq, 0)
        while True:
            changed = self._changed
            while position < len(self._events):
                yield self._events[position]
                position += 1
            await changed.wait()


# --- deciding --------------------------------------------------------------------------


class Action(str, enum.Enum):
    FINISH = "finish"  # all epochs done (or profiled): release everything
    STOP = "stop"  # stopped at an epoch boundary (asked here or by a peer): release everything
    RESTART = "restart"  # a worker died: same GPUs, from the newest checkpoint
    MOVE = "move"  # resize: release the GPUs not in the new set, start on the new set
    FAIL = "fail"  # give up: release everything


def failure_signature(message: str) -> str:
    """A failure message without what differs between two runs of the same failure (which rank and pid
    failed first, store ports)."""
    return re.sub(r":\d{2,5}\b", ":N", re.sub(r"\b(rank|pid|port) \d+", r"\1 N", message))


def decide(state: JobState, outcome: str, all_epochs_done: bool, restarts: int, max_restarts: int,
           has_new_local: bool, profiling: bool, repeated: bool = False) -> Action:
    """What to do once every local worker of an attempt has exited.

    outcome is `LaunchResult.outcome`; all_epochs_done says whether the
    checkpoint folder holds the last epoch (how a node without rank 0 tells
    "finished" from "stopped by a peer"); has_new_local says whether a pending
    resize puts ranks on this node; repeated says whether a failure is the
    same as the last one with no epoch done in between.
    """
    if outcome in ("finished", "profiled") or (outcome == "exited" and (all_epochs_done or profiling)):
        return Action.FINISH
    if outcome == "failed":
        if state is JobState.STOPPING:
            return Action.STOP
        if profiling or restarts >= max_restarts or repeated:
            return Action.FAIL
        if state is JobState.RESIZING:
            return Action.MOVE if has_new_local else Action.STOP
        return Action.RESTART
    if state is JobState.RESIZING and has_new_local:
        return Action.MOVE
    return Action.STOP


# --- doing -----------------------------------------------------------------------------


@dataclass
class _Job:
    """Mutable record of one job on this node (only touched under the supervisor's lock)."""

    spec: TrainSpec
    gpus: tuple[Gpu, ...]
    rendezvous: str
    attempt_base: str
    checkpoint_dir: str
    profile: ProfileSpec | None
    state: JobState = JobState.STARTING
    restarts: int = 0  # after worker failures, over the job's life here
    retry: int = 0  # restarts of the current attempt_base (store prefix <attempt_base>.r<retry>)
    epochs_done: int = 0
    attempt: AttemptSpec | None = None
    log_dir: Path | None = None
    group: WorkerGroup | None = None
    task: asyncio.Task | None = None
    pending: Directive | None = None
    started_ranks: set[int] = field(default_factory=set)
    note: str = ""
    message: str = ""
    last_failure: tuple[str, int] | None = None  # (failure_signature, epochs done then) of the last failure

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    def move(self, new: JobState, message: str = "") -> None:
        log.info("job_state", job_id=self.job_id, old=self.state.value, new=new.value, message=message)
        self.state = check_move(self.state, new)
        if message:
            self.message = message


def local_ranks(gpus: Sequence[Gpu], node_id: str) -> list[int]:
    return [rank for rank, g in enumerate(gpus) if g.node_id == node_id]


class Supervisor:
    """Runs the allocations of one node; see the module docstring."""

    def __init__(self, node_id: str, devices: dict[int, str], registry: Nodes, work_dir: str | os.PathLike | None = None,
                 max_restarts: int = 2, grace_s: float = 5.0, python: str = sys.executable,
                 rendezvous_timeout_s: float = 300.0, host: str = "127.0.0.1", warm_workers: bool = False,
                 runtime: Runtime | None = None) -> None:
        """devices: GPU index on this node -> worker device ("cpu" for a CPU slot, else the GPU index).
        warm_workers: keep a worker with torch imported waiting per device (warm.py).
        runtime: what runs the ranks (default: worker processes of `python`)."""
        if max_restarts < 0:
            raise ValueError(f"max_restarts {max_restarts!r} is negative")
        self.node_id = node_id
        self.devices = dict(devices)
        self.registry = registry
        self.max_restarts = max_restarts
        self.grace_s = grace_s
        self.pool = WarmPool(python) if warm_workers and runtime is None else None
        self.runtime = runtime or WorkerProcesses(python, grace_s, self.pool)
        self.rendezvous_timeout_s = rendezvous_timeout_s
        self.host = host
        self._own_tmp = None
        if work_dir is None:
            self._own_tmp = tempfile.TemporaryDirectory(prefix=f"omru-executor-{node_id}-")
            work_dir = self._own_tmp.name
        self.work_dir = Path(work_dir)
        self.lease_file = self.work_dir / "lease"  # until when the node's lease holds (`renewed`)
        self._lease = lease.LeaseWriter(self.lease_file)
        self.logs = LogStore(self.work_dir / "logs")
        self.events = EventLog(node_id)
        self._jobs: dict[str, _Job] = {}
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = asyncio.Lock()
        self._closing = False

    async def warm_up(self) -> None:
        """Start a waiting worker for every device of this node (with warm_workers)."""
        if self.pool is not None:
            for device in sorted(set(self.devices.values())):
                await self.pool.prepare(worker_env(dict(os.environ), device))

    def renewed(self, deadline_unix_s: float) -> None:
        """The node's lease surely holds until deadline_unix_s: the ranks read it (and
        stop without checkpointing once it passed, as when this executor is paused or killed)."""
        self._lease.write(deadline_unix_s)

    def _lease_lapsed(self) -> bool:
        return self._lease.deadline is not None and time.time() > self._lease.deadline

    # --- queries ---------------------------------------------------------------------

    def jobs(self) -> list[JobView]:
        return [self._view(j) for _, j in sorted(self._jobs.items())]

    def read_logs(self, job_id: str, attempt: int = 0, rank: int | None = None, offset: int = 0,
                  follow: bool = False) -> AsyncIterator[Chunk]:
        """What the job's ranks printed on this node (`LogStore.read`); follow ends with the attempt."""

        def live(folder: Path) -> bool:
            job = self._jobs.get(job_id)
            return job is not None and job.state.active and job.log_dir == folder

        return self.logs.read(job_id, attempt, rank, offset, follow, live)

    def _view(self, job: _Job) -> JobView:
        group = job.group
        pids = tuple(p.pid for r, p in sorted(group.procs.items()) if p.returncode is None) if group and job.state.active else ()
        return JobView(job.job_id, job.state, job.attempt_base,
                       tuple(job.gpus[r] for r in local_ranks(job.gpus, self.node_id)), len(job.gpus),
                       job.epochs_done, job.restarts, job.profile is not None, pids, job.message)

    # --- allocations -----------------------------------------------------------------

    async def allocate(self, d: Directive) -> None:
        """Bring the job to the attempt its allocation names (idempotent on directive_id and on the
        attempt): start it, or move it at its next epoch boundary when another attempt runs here.
        DirectiveError / ConflictError: refused, nothing changed."""
        if self._closing:
            raise ConflictError(f"executor of node {self.node_id} is shutting down")
        async with self._lock:
            job = self._jobs.get(d.job_id)
            if d.directive_id in self._seen or job is not None and job.state.active and d.attempt_id in (
                    job.attempt_base, job.pending.attempt_id if job.pending else None):
                return
            await self._move(d)
            self._seen[d.directive_id] = None
            while len(self._seen) > SEEN_DIRECTIVES:
                self._seen.popitem(last=False)

    async def deallocate(self, job_id: str, gpus: Sequence[Gpu]) -> None:
        """The job's allocation of this node is gone: stop it at its next epoch boundary (a profiling
        trial: at once, inside its timed iterations); when nothing of it runs here, report its GPUs
        (those of the allocation) as released at once."""
        async with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and job.state.active:
                await self._stop(job)
            elif gpus:
                self.events.append(job_id, EventKind.GPUS_RELEASED, gpus=tuple(g for g in gpus if g.node_id == self.node_id),
                                   message="allocation removed before it ran here")

    async def fence(self, why: str) -> None:
        """The node's lease is lost (the planner gives its GPUs to others): end every job at once,
        without another checkpoint, so nothing trains on after it."""
        async with self._lock:
            for job in [j for j in self._jobs.values() if j.state.active]:
                job.pending = None
                if job.state is not JobState.STOPPING:
                    job.move(JobState.STOPPING, why)
                if job.group is not None:
                    await job.group.terminate()

    def _local(self, d: Directive) -> list[tuple[int, Gpu]]:
        """(rank, GPU) of the directive's ranks on this node; DirectiveError when the node cannot host them."""
        mine = [(rank, g) for rank, g in enumerate(d.gpus) if g.node_id == self.node_id]
        if len(mine) > len(self.devices):
            raise DirectiveError("directive.gpus", f"{len(mine)} GPUs on node {self.node_id}, which has only "
                                 f"{len(self.devices)} slots")
        for rank, g in mine:
            if g.index not in self.devices:
                raise DirectiveError(f"directive.gpus[{rank}].index", f"{g.index} is out of range on node "
                                     f"{self.node_id} (slots {sorted(self.devices)})")
        spec = d.spec
        # (a profiling trial may measure any GPU count: the planner, not the trial, keeps the job in its range)
        if spec is not None and d.profile is None and not spec.min_gpus <= len(d.gpus) <= spec.max_gpus:
            raise DirectiveError("directive.gpus", f"{len(d.gpus)} ranks, but job {d.job_id} runs on "
                                 f"{spec.min_gpus}..{spec.max_gpus} GPUs (job.min_gpus, job.max_gpus)")
        spans = any(g.node_id != self.node_id for g in d.gpus)
        if mine and spans:
            if not d.rendezvous:
                raise DirectiveError("directive.rendezvous_endpoint", "is required when the job spans nodes")
            if not d.attempt_id:
                raise DirectiveError("directive.attempt_id", "is required when the job spans nodes")
            if not d.checkpoint_dir and (d.profile is None or d.rendezvous.endswith(":0")):
                raise DirectiveError("directive.checkpoint_dir", "is required (a folder all nodes share) when the "
                                     "job spans nodes" + (" and rank 0 publishes its port there (port 0)"
                                                          if d.profile is not None else ""))
        return mine

    def _check_free(self, job_id: str, gpus: Sequence[Gpu]) -> None:
        for other in self._jobs.values():
            if other.job_id == job_id or not other.state.active:
                continue
            held = set(other.gpus) | set(other.pending.gpus if other.pending else ())
            for g in gpus:
                if g in held:
                    raise ConflictError(f"GPU {g} is held by job {other.job_id!r} (state {other.state})")

    async def _check_checkpoint(self, spec: TrainSpec, checkpoint_dir: str) -> None:
        """DirectiveError when the newest checkpoint in the folder belongs to another model or configuration."""

        # (in a thread: the real check loads torch, seconds the event loop and the node's lease must not wait)
        problem = await asyncio.to_thread(self.runtime.checkpoint_problem, spec, checkpoint_dir)
        if problem:
            raise DirectiveError("directive.checkpoint_dir", problem)

    def _checkpoint_dir(self, d: Directive, attempt_base: str) -> str:
        if d.profile is not None:  # a trial keeps no state: the stop file (and, spread, rank 0's port) only
            return d.checkpoint_dir or str(self.work_dir / "profile" / attempt_base)
        return d.checkpoint_dir or str(self.work_dir / "jobs" / d.job_id / "checkpoints")

    async def _start(self, d: Directive) -> None:
        gpus = [g for _, g in self._local(d)]
        self._check_free(d.job_id, gpus)
        if d.spec.workdir and not os.path.isdir(d.spec.workdir):
            raise DirectiveError("directive.job.workdir", f"{d.spec.workdir!r} is not a folder on node {self.node_id}")
        attempt_base = d.attempt_id or f"{d.job_id[:100]}-{uuid.uuid4().hex[:8]}"
        checkpoint_dir = self._checkpoint_dir(d, attempt_base)
        if d.profile is None:
            await self._check_checkpoint(d.spec, checkpoint_dir)
        job = _Job(spec=d.spec, gpus=d.gpus, rendezvous=d.rendezvous, attempt_base=attempt_base,
                   checkpoint_dir=checkpoint_dir, profile=d.profile)
        self._jobs[d.job_id] = job
        job.task = asyncio.get_running_loop().create_task(self._run(job), name=f"job-{d.job_id}")

    async def _move(self, d: Directive) -> None:
        """Start the job on d (when nothing of it runs here), or move it to d at its next epoch boundary."""
        job = self._jobs.get(d.job_id)
        if job is None or not job.state.active:
            if local_ranks(d.gpus, self.node_id):
                await self._start(d)  # the job comes (back) to this node
            return
        if job.profile is not None or d.profile is not None:
            raise ConflictError(f"job {d.job_id!r} is a profiling trial on node {self.node_id}; trials are not resized")
        if d.spec.fingerprint() != job.spec.fingerprint() or d.spec.model != job.spec.model:
            raise DirectiveError("directive.job", f"differs from the running job {d.job_id!r} (model, classes or input)")
        new = [g for _, g in self._local(d)]
        self._check_free(d.job_id, new)
        previous = job.pending
        job.pending = d
        if previous is not None:  # a newer allocation replaces a pending one
            self._release(job, [g for g in previous.gpus if g.node_id == self.node_id
                                and g not in job.gpus and g not in new])
        if job.state is not JobState.RESIZING:
            job.move(JobState.RESIZING, f"moving to {len(d.gpus)} GPUs for {d.directive_id}")
        if job.group is not None:
            job.group.request_stop()
            await self._stop_now_if_a_peer_is_lost(job)

    async def _stop(self, job: _Job) -> None:
        if job.state is JobState.STOPPING:
            return
        if job.pending is not None:
            pending, job.pending = job.pending, None
            self._release(job, [g for g in pending.gpus if g.node_id == self.node_id and g not in job.gpus])
        job.move(JobState.STOPPING, "its allocation was removed")
        if job.group is not None:
            job.group.request_stop()
            await self._stop_now_if_a_peer_is_lost(job)

    async def _stop_now_if_a_peer_is_lost(self, job: _Job) -> None:
        """Terminate the workers at once when the attempt has ranks on a node that is gone.

        Its next epoch boundary never comes: the collectives (or the
        rendezvous) wait for the lost ranks until their timeout. The job then
        stops or moves as after any stop, from its last checkpoint (only the
        epoch in progress is lost, which it was anyway)."""
        peers = {g.node_id for g in job.gpus} - {self.node_id}
        if not peers:
            return
        try:
            lost = sorted(peers - await self.registry.nodes())
        except Exception as exc:  # registry away: the workers stop at their epoch boundary as asked
            log.warning("peer_check_failed", job_id=job.job_id, error=str(exc))
            return
        if lost:
            log.warning("peer_lost", job_id=job.job_id, nodes=lost, attempt_id=job.attempt.attempt_id if job.attempt else "")
            await job.group.terminate()

    # --- the job's life --------------------------------------------------------------

    def _launch_attempt(self, job: _Job) -> AttemptSpec:
        suffix = f".r{job.retry}" if job.retry else ""
        attempt_id = f"{job.attempt_base}{suffix}"
        rendezvous = job.rendezvous or f"{self.host}:{free_port(self.host)}"
        devices = tuple(self.devices[g.index] if g.node_id == self.node_id else "cpu" for g in job.gpus)
        return AttemptSpec(attempt_id=attempt_id, world_size=len(job.gpus), rendezvous=rendezvous,
                           checkpoint_dir=job.checkpoint_dir, devices=devices,
                           stop_file=os.path.join(job.checkpoint_dir, f".stop-{attempt_id}"), profile=job.profile,
                           timeout_s=self.rendezvous_timeout_s, lease_file=str(self.lease_file))

    async def _run(self, job: _Job) -> None:
        try:
            while True:
                async with self._lock:
                    group = await self._start_group(job)
                result = await group.wait() if group is not None else None
                async with self._lock:
                    if result is None or not await self._after_exit(job, result):
                        return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or the OS refused: never leave a job silently stuck
            log.exception("job_supervision_failed", job_id=job.job_id)
            async with self._lock:
                if job.state.active:
                    await self._end(job, JobState.FAILED, f"executor error: {type(exc).__name__}: {exc}")

    async def _start_group(self, job: _Job) -> WorkerGroup | None:
        job.attempt = attempt = self._launch_attempt(job)
        job.started_ranks = set()
        os.makedirs(job.checkpoint_dir, exist_ok=True)
        job.log_dir = self.logs.new_attempt(job.job_id, attempt.attempt_id).folder
        group = self.runtime.group(job.spec, attempt, local_ranks(job.gpus, self.node_id),
                                   lambda record: self._on_record(job, attempt, record), job.log_dir)
        job.group = group
        try:
            await group.start()
        except OSError as exc:
            await group.terminate()
            await self._end(job, JobState.FAILED, f"workers could not start: {exc}")
            return None
        if job.spec.is_script:  # (what it does next the executor may never hear of)
            from omru import checkpoint

            found = checkpoint.list_checkpoints(job.checkpoint_dir)
            job.epochs_done = max(job.epochs_done, found[-1][0] if found else 0)
            self._started(job, attempt, epoch=job.epochs_done, lr=0.0, global_batch=job.spec.batch_size * len(job.gpus),
                          where=f"{' '.join(job.spec.command)[:200]} (MASTER {':'.join(map(str, group.master or ()))})")
        if job.state in (JobState.RESIZING, JobState.STOPPING):
            group.request_stop()
        return group

    def _started(self, job: _Job, attempt: AttemptSpec, epoch: int, lr: float, global_batch: int, where: str) -> None:
        """The attempt's local ranks run: RUNNING, STARTED event."""
        if job.state is JobState.STARTING:
            job.move(JobState.RUNNING)
        local = tuple(job.gpus[r] for r in local_ranks(job.gpus, self.node_id))
        self.events.append(job.job_id, EventKind.STARTED, epoch=epoch, gpus=local, lr=lr, global_batch=global_batch,
                           restarts=job.restarts, message="; ".join(m for m in (job.note, where) if m),
                           attempt_id=job.attempt_base, world_size=attempt.world_size)

    def _on_record(self, job: _Job, attempt: AttemptSpec, record: dict) -> None:
        if job.attempt is not attempt:
            return
        kind = record.get("event")
        common = {"attempt_id": job.attempt_base, "world_size": attempt.world_size}
        if kind == "started":
            job.started_ranks.add(int(record.get("rank", -1)))
            job.epochs_done = max(job.epochs_done, int(record.get("start_epoch") or 0))
            if len(job.started_ranks) == len(local_ranks(job.gpus, self.node_id)) and not job.spec.is_script:
                where = f"{record.get('backend')} on {record.get('device')}, store prefix {attempt.attempt_id}"
                if record.get("resumed_from"):
                    where += f"; resumed from {os.path.basename(record['resumed_from'])}"
                self._started(job, attempt, epoch=int(record.get("start_epoch") or 0), lr=float(record.get("lr") or 0.0),
                              global_batch=int(record.get("global_batch") or 0), where=where)
        elif kind == "epoch_done":
            job.epochs_done = max(job.epochs_done, int(record["epoch"]))
            self.events.append(job.job_id, EventKind.EPOCH_DONE, epoch=int(record["epoch"]),
                               epoch_seconds=float(record["epoch_seconds"]), loss=float(record["loss"]),
                               accuracy=float(record["accuracy"]), lr=float(record["lr"]),
                               steps=int(record.get("steps") or 0), global_batch=int(record.get("global_batch") or 0),
                               **common)
        elif kind == "stopped":
            job.epochs_done = max(job.epochs_done, int(record.get("epoch") or 0))

    def _all_epochs_done(self, job: _Job) -> bool:
        from omru import checkpoint

        found = checkpoint.list_checkpoints(job.checkpoint_dir)
        done = found[-1][0] if found else 0
        job.epochs_done = max(job.epochs_done, done)
        return done >= job.spec.epochs

    async def _after_exit(self, job: _Job, result: LaunchResult) -> bool:
        """Carry out `decide`; True when a new attempt must be launched."""
        if job.profile is not None and job.spec.is_script and result.outcome == "exited" and \
                0 in local_ranks(job.gpus, self.node_id):
            result = LaunchResult("failed", result.records, result.returncodes,
                                  "the script exited without timing its iterations: a profiling trial needs "
                                  "omru.elastic (for batch in ctx.batches(loader))")
        all_done = result.outcome == "exited" and job.profile is None and (
            self._all_epochs_done(job) or (job.spec.is_script and job.state is JobState.RUNNING))
        pending_local = local_ranks(job.pending.gpus, self.node_id) if job.pending else []
        repeated = False
        if result.outcome == "failed":
            same = (failure_signature(result.message), job.epochs_done)
            repeated, job.last_failure = job.last_failure == same, same
        action = decide(job.state, result.outcome, all_done, job.restarts, self.max_restarts, bool(pending_local),
                        job.profile is not None, repeated)
        log.info("attempt_exited", job_id=job.job_id, attempt_id=job.attempt.attempt_id, outcome=result.outcome,
                 state=job.state.value, action=action.value, message=result.message, returncodes=result.returncodes)
        self_stop = (self._closing or self._lease_lapsed()) and action in (Action.RESTART, Action.MOVE)
        if self_stop:
            action = Action.STOP  # (a node whose lease lapsed starts nothing: its allocations are gone)
        if action is Action.FINISH:
            self._report_final(job, result)
            await self._end(job, JobState.FINISHED, f"finished {job.epochs_done} epochs" if job.profile is None
                            else "profiled")
            return False
        if action is Action.STOP:
            await self._end(job, JobState.STOPPED, (f"{SELF_STOP}: " if self_stop else "")
                            + f"stopped after epoch {job.epochs_done}" + (f" ({result.message})" if result.message else ""))
            return False
        if action is Action.FAIL:
            why = result.message or f"workers ended with outcome {result.outcome}"
            if repeated:
                why = f"failed the same way twice with no epoch done in between: {why}"
            elif job.profile is None:
                why = f"gave up after {job.restarts} restarts: {why}"
            await self._end(job, JobState.FAILED, why)
            return False
        if result.outcome == "failed":
            job.restarts += 1
            job.note = f"restart {job.restarts}/{self.max_restarts} after: {result.message}"
        else:
            job.note = ""
        if action is Action.RESTART:
            job.retry += 1
            job.move(JobState.RESTARTING, result.message)
            job.move(JobState.STARTING)
            return True
        # MOVE: give back what the new set does not use, then start on it.
        target, job.pending = job.pending, None
        local = [g for g in job.gpus if g.node_id == self.node_id]
        self._release(job, [g for g in local if g not in target.gpus], kept=[g for g in local if g in target.gpus])
        job.gpus, job.rendezvous = target.gpus, target.rendezvous
        job.attempt_base = target.attempt_id or f"{job.job_id[:100]}-{uuid.uuid4().hex[:8]}"
        job.retry = 0
        job.move(JobState.STARTING, f"resized to {len(target.gpus)} GPUs by {target.directive_id}")
        return True

    def _report_final(self, job: _Job, result: LaunchResult) -> None:
        common = {"attempt_id": job.attempt_base, "world_size": job.attempt.world_size}
        exited = job.spec.is_script and result.outcome == "exited" and 0 in local_ranks(job.gpus, self.node_id)
        if result.outcome == "finished" or exited:  # (a script without omru.elastic: all its ranks exited 0)
            final = (result.of("finished") or [{}])[-1]
            job.epochs_done = max(job.epochs_done, job.spec.epochs)
            self.events.append(job.job_id, EventKind.FINISHED, epoch=int(final.get("epochs") or job.spec.epochs),
                               accuracy=float(final.get("accuracy") or 0.0), loss=float(final.get("loss") or 0.0),
                               epoch_seconds=0.0, message=f"{final['seconds']:.1f} s in this attempt" if final
                               else "every rank exited 0", **common)
        elif result.outcome == "profiled":
            p = result.of("profile")[-1]
            self.events.append(job.job_id, EventKind.PROFILED, iter_seconds=float(p["iter_seconds"]),
                               epoch_seconds=float(p["epoch_seconds"]), steps=int(p["steps"]),
                               global_batch=int(p["global_batch"]),
                               message=f"{p['mode']}: {p['iters']} iterations after {p['warmup_iters']} warm-up on "
                                       f"{p['device']}", **common)

    async def _end(self, job: _Job, state: JobState, message: str) -> None:
        """Terminal for this node: state, FAILED event when failing, release every local GPU (GPUS_RELEASED)."""
        if job.group is not None:
            await job.group.terminate()
        job.move(state, message)
        if state is JobState.FAILED:
            self.events.append(job.job_id, EventKind.FAILED, message=message, restarts=job.restarts,
                               attempt_id=job.attempt_base, world_size=len(job.gpus))
        if job.profile is not None:  # a trial's folder only held its stop file
            shutil.rmtree(job.checkpoint_dir, ignore_errors=True)
        held = [g for g in job.gpus if g.node_id == self.node_id]
        if job.pending is not None:
            held += [g for g in job.pending.gpus if g.node_id == self.node_id and g not in held]
            job.pending = None
        self._release(job, held, why=message if state is JobState.STOPPED else "")

    def _release(self, job: _Job, gpus: list[Gpu], why: str = "", kept: Sequence[Gpu] = ()) -> None:
        """Give the GPUs up and say so (GPUS_RELEASED, under the running attempt): the planner, which
        claimed them for an allocation, gives up its claims only on that event. `kept`: GPUs the attempt
        hands to the job's next attempt here (a move); the event names them too, as the attempt is gone
        from them (the planner starts the new attempt's other nodes once the old attempt is gone
        everywhere), but their claims stay."""
        if not gpus and not kept:
            return
        self.events.append(job.job_id, EventKind.GPUS_RELEASED, gpus=(*gpus, *kept), message=why,
                           attempt_id=job.attempt_base, world_size=len(job.gpus), epoch=job.epochs_done)

    # --- shutdown --------------------------------------------------------------------

    async def close(self) -> None:
        """Stop every worker now (SIGTERM, then SIGKILL) and release the GPUs."""
        self._closing = True
        for job in list(self._jobs.values()):
            if job.group is not None:
                await job.group.terminate()
        tasks = [j.task for j in self._jobs.values() if j.task is not None and not j.task.done()]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=self.grace_s + 10)
            for t in pending:
                t.cancel()
        if self.pool is not None:
            await self.pool.close()
        self._lease.close()
        if self._own_tmp is not None:
            with contextlib.suppress(OSError):
                self._own_tmp.cleanup()
