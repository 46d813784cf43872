"""Profiling trials: allocations like any other, written by the planner.

The profiler asks for a trial (PlannerService.RunTrial: a job, a GPU count,
a GPU kind, what to measure); `Trials.run` queues it until enough GPUs of
the kind are free (owned by no job or trial in the dispatcher's `owner` map,
held by no job's attempt) and picks them on the fewest nodes (`pick_free`).
Nothing is written while it waits. Then one transaction
(`PlannerState.change`, fenced by the leader key like every write) claims
them for a fresh id ``<job>.prof-g<g>-<hex>`` (the trial's job id and
attempt id) and writes its allocation, a START Directive with the profile
options, to every node it spans; a claim that races with a job's refuses the
write and the trial waits again. The executors run it as they run any
allocation (AllocationWatch).

The dispatcher hands the trial's executor events here (`take`), not to its
job logic: PROFILED from rank 0's node and GPUS_RELEASED from every node
make the result, and the allocations and claims go in one transaction.
FAILED (or a node lost) fails the trial with the node's message; a trial
that does not finish within its timeout (the request's deadline, or the
configured trial timeout) is stopped. Either way its allocations are
removed at once (the executors stop it) and its claims once every node
reported its GPUs released (or after RELEASE_WAIT_S), so the planner's view
of free GPUs never runs ahead of the executors. The dispatcher counts
trial-held GPUs as owned (no job starts on them) and replans when they are
freed. A planner that takes over finds the trials of the one before in the
claims and ends them the same way (`recover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from omru.v1 import common_pb2, executor_pb2
from services.common.gpus import most_common_kind
from services.common.aio import wait_event
from services.common.etcd import Fenced
from services.common.logging import get_logger
from services.executor.servicer import is_refusal

log = get_logger(__name__)

Gpu = tuple[str, int]

#: Seconds a trial runs before it is stopped, unless the request's deadline comes first.
TRIAL_TIMEOUT_S = 600.0
#: Seconds a stopped trial's claims wait for its executors to report the GPUs released.
RELEASE_WAIT_S = 60.0
#: Seconds between looks at the free GPUs while a trial waits (a release wakes it sooner).
POLL_S = 1.0
#: A trial's answer leaves this long before the request's deadline (the reply must arrive in time).
REPLY_MARGIN_S = 1.0

_TRIAL_ID = re.compile(r"\.prof-g\d+-[0-9a-f]{8}$")


def is_trial_id(job_id: str) -> bool:
    """True for the id of a profiling trial (``<job>.prof-g<g>-<8 hex>``)."""
    return bool(_TRIAL_ID.search(job_id))


class TrialError(Exception):
    """A trial that did not measure: `code` is the grpc.StatusCode name to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Measured:
    """What a trial measured (RunTrialResponse)."""

    trial_id: str
    gpus: int
    nodes: int
    iter_seconds: float
    steps: int
    epoch_seconds: float


def kinds(nodes: Mapping[str, object]) -> Counter:
    """GPU kind -> how many the live nodes (registry Nodes) have."""
    return Counter(g.kind for n in nodes.values() for g in n.gpus)


def main_kind(nodes: Mapping[str, object]) -> str:
    """The kind the cluster has most of ("" when it has no GPU)."""
    return most_common_kind(g.kind for n in nodes.values() for g in n.gpus)


def pick_free(nodes: Mapping[str, object], kind: str, taken: set[Gpu], gpus: int) -> list[Gpu] | None:
    """gpus GPUs of kind not in taken, on the fewest nodes (the nodes with most free first, then by id),
    rank 0's node first; None when fewer are free."""
    free = [(node_id, [g.index for g in n.gpus if g.kind == kind and (node_id, g.index) not in taken])
            for node_id, n in nodes.items()]
    free.sort(key=lambda item: (-len(item[1]), item[0]))
    chosen = [(node_id, i) for node_id, indices in free for i in sorted(indices)][:gpus]
    return chosen if len(chosen) == gpus else None


@dataclass(eq=False)
class _Trial:
    trial_id: str
    gpus: tuple[Gpu, ...] = ()
    nodes: tuple[str, ...] = ()  # rank 0's node first
    profiled: executor_pb2.ExecutorEvent | None = None
    released: set = field(default_factory=set)  # nodes that reported its GPUs released
    failure: TrialError | None = None
    news: asyncio.Event = field(default_factory=asyncio.Event)

    def fail(self, error: TrialError) -> None:
        if self.failure is None:
            self.failure = error
        self.news.set()

    @property
    def done(self) -> bool:
        return self.failure is not None or (self.profiled is not None and self.released >= set(self.nodes))


class Trials:
    """The planner's profiling trials, over one Dispatcher (its nodes, `owner` map and writes)."""

    def __init__(self, dispatcher, trial_timeout_s: float = TRIAL_TIMEOUT_S, release_wait_s: float = RELEASE_WAIT_S,
                 poll_s: float = POLL_S) -> None:
        self.d = dispatcher
        self.trial_timeout_s, self.release_wait_s, self.poll_s = trial_timeout_s, release_wait_s, poll_s
        self._trials: dict[str, _Trial] = {}  # trial id -> trial, from its write until its claims are gone
        self._reserved: set[Gpu] = set()  # GPUs a trial is writing its claims on
        self._freed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    # --- hooks the dispatcher calls -------------------------------------------------

    def freed(self) -> None:
        """GPUs were released or a node came: waiting trials look again."""
        self._freed.set()

    def take(self, event: executor_pb2.ExecutorEvent) -> bool:
        """True when the event is a trial's (it is then handled here, not by the job logic)."""
        trial = self._trials.get(event.job_id)
        if trial is None:
            return is_trial_id(event.job_id) and event.job_id not in self.d.records
        K = executor_pb2
        if event.kind == K.EXECUTOR_EVENT_KIND_FAILED:
            trial.fail(TrialError("FAILED_PRECONDITION" if is_refusal(event.message) else "ABORTED",
                                  f"trial {trial.trial_id} failed on node {event.node_id}: {event.message}"))
        elif event.kind == K.EXECUTOR_EVENT_KIND_PROFILED and trial.nodes and event.node_id == trial.nodes[0]:
            trial.profiled = event
        elif event.kind == K.EXECUTOR_EVENT_KIND_GPUS_RELEASED:
            trial.released.add(event.node_id)
            if trial.profiled is None and trial.nodes and event.node_id == trial.nodes[0]:
                trial.fail(TrialError("ABORTED", f"trial {trial.trial_id} released its GPUs without a measurement: "
                                                 f"{event.message}"))
        trial.news.set()
        return True

    def node_lost(self, node_id: str) -> None:
        """Its claims went with its lease: a trial on it fails (and counts it released)."""
        for trial in self._trials.values():
            if node_id in trial.nodes:
                trial.released.add(node_id)
                trial.fail(TrialError("ABORTED", f"trial {trial.trial_id}: node {node_id} was lost"))

    async def recover(self) -> None:
        """End the trials a planner before this one left (their claims are in `owner`, nobody waits
        for them): remove their allocations, then their claims once released."""
        stale: dict[str, list[Gpu]] = {}
        for g, job_id in self.d.owner.items():
            if is_trial_id(job_id) and job_id not in self._trials and job_id not in self.d.records:
                stale.setdefault(job_id, []).append(g)
        for trial_id, gpus in stale.items():
            trial = _Trial(trial_id, tuple(sorted(gpus)), tuple(dict.fromkeys(n for n, _ in sorted(gpus))))
            self._trials[trial_id] = trial
            log.warning("trial_abandoned", trial_id=trial_id, gpus=trial.gpus)
            self._spawn(self._end(trial, TrialError("ABORTED", "abandoned by the planner before")))

    async def stop(self) -> None:
        """Stop acting (the dispatcher stops): trials under way end with the leader's term."""
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t
        self._tasks.clear()
        self._trials.clear()
        self._reserved.clear()

    # --- running a trial -------------------------------------------------------------

    async def run(self, job: common_pb2.JobSpec, gpus: int, kind: str, profile: executor_pb2.ProfileOptions,
                  timeout_s: float | None = None) -> Measured:
        """Run one trial (see the module docstring); TrialError when it did not measure. timeout_s: the
        request's time left (None: the configured trial timeout alone bounds the run)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s - REPLY_MARGIN_S if timeout_s is not None else None
        answer: asyncio.Future = loop.create_future()
        trial = _Trial(f"{job.job_id[:96]}.prof-g{gpus}-{uuid.uuid4().hex[:8]}")
        task = self._spawn(self._life(trial, job, gpus, kind, profile, deadline, answer))
        task.add_done_callback(lambda _: answer.done() or answer.set_exception(
            TrialError("UNAVAILABLE", "the planner stopped leading before the trial ended")))
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            if not answer.done():  # the caller left (or the planner stops): the trial ends, its GPUs come back
                trial.fail(TrialError("CANCELLED", f"trial {trial.trial_id} was cancelled by its caller"))
                if not trial.nodes:
                    task.cancel()
                answer.cancel()
            raise

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _life(self, trial: _Trial, job, gpus: int, kind: str, profile, deadline: float | None,
                    answer: asyncio.Future) -> None:
        try:
            await self._place(trial, job, gpus, kind, profile, deadline)
            outcome = await self._outcome(trial, deadline)
        except TrialError as exc:
            outcome = exc
        except Fenced as exc:
            self.d._broken("trial_fenced", exc, trial_id=trial.trial_id)
            outcome = TrialError("UNAVAILABLE", f"this planner no longer leads: {exc}")
        except asyncio.CancelledError:
            if not answer.done():
                answer.set_exception(TrialError("UNAVAILABLE", "the planner stopped leading while the trial ran"))
            raise
        except Exception as exc:  # etcd away, a bug: say so rather than leave the caller waiting
            log.exception("trial_broken", trial_id=trial.trial_id)
            outcome = TrialError("UNAVAILABLE", f"trial {trial.trial_id} broke: {exc}")
        if isinstance(outcome, Measured):
            await self._finish(trial)
            log.info("trial_done", trial_id=trial.trial_id, gpus=gpus, iter_seconds=outcome.iter_seconds)
            if not answer.done():
                answer.set_result(outcome)
        else:
            if not answer.done():
                answer.set_exception(outcome)
            if trial.nodes:
                await self._end(trial, outcome)

    async def _place(self, trial: _Trial, job, gpus: int, kind: str, profile, deadline: float | None) -> None:
        """Wait for free GPUs (writing nothing), then claim and allocate them in one transaction."""
        loop = asyncio.get_running_loop()
        waited = False
        while True:
            if trial.failure is not None:
                raise trial.failure
            if deadline is not None and deadline <= loop.time():
                raise TrialError("DEADLINE_EXCEEDED", f"trial of {job.job_id} on {gpus} GPUs: the request's deadline "
                                                      "came before it could start")
            chosen = pick_free(self.d.nodes, kind or main_kind(self.d.nodes), self._taken(), gpus)
            if chosen is not None:
                if await self._write_start(trial, job, chosen, profile):
                    return
                why = "a job claimed them first"
            else:
                why = f"fewer than {gpus} {kind or 'main-kind'} GPUs free"
            if not waited:
                log.info("trial_waits", trial_id=trial.trial_id, gpus=gpus, why=why)
                waited = True
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise TrialError("DEADLINE_EXCEEDED", f"trial of {job.job_id} waited for {gpus} free GPUs past the "
                                                      f"request's deadline ({why})")
            self._freed.clear()
            await wait_event(self._freed, min(self.poll_s, left) if left is not None else self.poll_s)

    def _taken(self) -> set[Gpu]:
        """GPUs no trial may take: claimed, being claimed, or held by a job's attempt."""
        held = {g for r in self.d.records.values() if not r.terminal for g in (*r.gpus, *r.target)}
        return set(self.d.owner) | self._reserved | held

    async def _write_start(self, trial: _Trial, job, chosen: Sequence[Gpu], profile) -> bool:
        nodes = tuple(dict.fromkeys(n for n, _ in chosen))
        spec = common_pb2.JobSpec()
        spec.CopyFrom(job)
        spec.job_id = trial.trial_id
        host = self.d.nodes[nodes[0]].address.rpartition(":")[0]
        # spread, as for a job: rank 0 binds a port its host has free and publishes it in the trial's
        # folder under the shared checkpoint root (a trial writes no checkpoint there)
        spread = len(nodes) > 1
        directive = executor_pb2.Directive(
            directive_id=f"{trial.trial_id}.start", kind=executor_pb2.DIRECTIVE_KIND_START, job=spec,
            gpus=[common_pb2.GpuRef(node_id=n, index=i) for n, i in chosen],
            rendezvous_endpoint=f"{host}:0" if spread else "",
            checkpoint_dir=self._folder(trial) if spread else "", attempt_id=trial.trial_id, profile=profile)
        value = directive.SerializeToString(deterministic=True)
        trial.gpus, trial.nodes = tuple(chosen), nodes
        self._trials[trial.trial_id] = trial  # (before the write: its events may come before the reply)
        self._reserved.update(chosen)
        try:
            ok = await self.d._write(trial.trial_id, claim={g: self.d.nodes[g[0]].lease_id for g in chosen},
                                     put={n: (value, self.d.nodes[n].lease_id) for n in nodes})
        finally:
            self._reserved.difference_update(chosen)
        if not ok:
            self._trials.pop(trial.trial_id, None)
            trial.gpus, trial.nodes = (), ()
            return False
        log.info("trial_started", trial_id=trial.trial_id, gpus=list(chosen), nodes=list(nodes))
        return True

    async def _outcome(self, trial: _Trial, deadline: float | None) -> Measured:
        loop = asyncio.get_running_loop()
        until = loop.time() + self.trial_timeout_s
        if deadline is not None:
            until = min(until, deadline)
        while not trial.done:
            trial.news.clear()
            left = until - loop.time()
            if left <= 0:
                raise TrialError("DEADLINE_EXCEEDED", f"trial {trial.trial_id} on {len(trial.gpus)} GPUs did not finish "
                                                      f"in time (trial timeout {self.trial_timeout_s:.0f} s, or the "
                                                      f"request's deadline)")
            await wait_event(trial.news, left)
        if trial.failure is not None:
            raise trial.failure
        p = trial.profiled
        return Measured(trial.trial_id, len(trial.gpus), len(trial.nodes), p.iter_seconds, p.steps, p.epoch_seconds)

    async def _finish(self, trial: _Trial) -> None:
        """Measured and released everywhere: allocations and claims go in one transaction."""
        try:
            await self.d._write(trial.trial_id, drop=list(trial.nodes),
                                release=[g for g in trial.gpus if self.d.owner.get(g) == trial.trial_id])
        finally:
            self._gone(trial)

    async def _end(self, trial: _Trial, why: TrialError) -> None:
        """Stop a trial that will not measure: its allocations go now (its executors stop it), its claims
        once every node reported its GPUs released (at most release_wait_s)."""
        try:
            log.info("trial_stopping", trial_id=trial.trial_id, why=str(why))
            await self.d._write(trial.trial_id, drop=list(trial.nodes))
            loop = asyncio.get_running_loop()
            until = loop.time() + self.release_wait_s
            while not trial.released >= set(trial.nodes) and loop.time() < until:
                trial.news.clear()
                await wait_event(trial.news, until - loop.time())
            if not trial.released >= set(trial.nodes):
                log.warning("trial_release_late", trial_id=trial.trial_id,
                            nodes=sorted(set(trial.nodes) - trial.released))
            mine = [g for g in trial.gpus if self.d.owner.get(g) == trial.trial_id]
            if mine:
                await self.d._write(trial.trial_id, release=mine)
        finally:
            self._gone(trial)

    def _folder(self, trial: _Trial) -> str:
        return f"{self.d.checkpoint_root}/trials/{trial.trial_id}"

    def _gone(self, trial: _Trial) -> None:
        self._trials.pop(trial.trial_id, None)
        if len(trial.nodes) > 1:  # its rendezvous folder
            self._spawn(asyncio.to_thread(shutil.rmtree, self._folder(trial), True))
        self.d.poke()  # the GPUs are free again: the plan may use them
        self.d._follow_soon()
        self.freed()

