"""Plan -> GPU claims -> directives: the plan is carried out as it really happens.

`Dispatcher` is the planner's engine, in three parts, each in its own module:

- ingest (ingest.py, `Ingest`): the registry's nodes and every executor's
  event log in; job records (state.py, through its one transition table),
  released claims, learned epoch times, and requests for a pass out;
- reconcile (here): plan -> decide. Replanning (`reconcile`) happens when a
  job is submitted, cancelled or fails, a node joins or is lost, a job's mean
  epoch time departs from the plan's by more than REPLAN_DEVIATION and enough
  to move its end by more than the lateness slack (`departs`), a job ends
  early, or nothing planned can start while every job waits. It plans the
  remaining work with the policy from the core registry (problem.py: the
  problem from the live jobs, with what runs as committed history; the plan
  in force kept unless the new one is better by more than
  MAKESPAN_TOLERANCE; the plan back as steps); the planning runs in a thread
  (a large problem: in a child process, so that it does not starve the event
  loop of the GIL: lease keep-alives, executor events) and everything keeps
  going meanwhile. Following (`_follow`, on every event that frees GPUs or
  brings a job to a planned move) decides which planned steps begin now, on
  exactly the planned GPUs and in the planned order per GPU (follow.py);
- actuation (actuate.py, `Actuation`): each move, stop and release written as
  desired state, one fenced etcd transaction each, which the executors
  reconcile (services/executor/servicer.py AllocationWatch). A GPU's claim is
  given up when its executor reports it released, never before: the
  planner's view of free GPUs never runs ahead of the executors.

This planner is the one writer of job records and keeps them in memory too.
Profiles: a job submitted with epoch times (workload `profile:`) uses them;
otherwise the profiler service measures it, each trial run by this planner
as an allocation like a job's (trials.py: the thin hooks in ingest route a
trial's executor events there and count its GPUs as owned). Every epoch an
executor reports refines them (learn.py: the planner plans with the mean
epoch time observed at each placement once it settled away from the time
planned there). Start overhead (directive sent -> first epoch done, minus
that epoch's own seconds) is measured on every attempt; until the first
measurement the configured prior is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from services.common.aio import wait_event
from services.common.etcd import Fenced
from services.common.logging import get_logger
from services.planner import state as st
from services.planner import problem as planning
from services.planner import retention
from services.planner.actuate import Actuation
from services.planner.follow import Live, Step, blockers, follow, late
from services.planner.ingest import Ingest
from services.planner.learn import settled, timing
from services.planner.metrics import PlannerMeter
from services.planner.state import JobRecord, PlannerState
from services.planner.trials import TRIAL_TIMEOUT_S, Trials, is_trial_id

log = get_logger(__name__)

Gpu = tuple[str, int]

#: Plans whose makespans differ by less than this share count as equal (see policies/omru.py).
MAKESPAN_TOLERANCE = 0.02
#: A replan waits until no change came for this many seconds, but no longer than REPLAN_QUIET_MAX_S, and
#: while submissions are being handled (a big batch comes in several concurrent calls, planned together)
#: up to SUBMISSIONS_WAIT_MAX_S.
REPLAN_QUIET_S = 0.2
REPLAN_QUIET_MAX_S = 2.0
SUBMISSIONS_WAIT_MAX_S = 10.0
#: Seconds between passes over the plan when no event asks for one.
FOLLOW_EVERY_S = 5.0
#: Seconds between sweeps of the checkpoint root for folders past their retention (at most).
SWEEP_EVERY_S = 600.0
#: A step that should have begun this share of the plan's makespan ago, while a GPU it needs idles, or a
#: job that ends this much earlier than planned, makes the planner replan.
REPLAN_LATE = 0.05
#: A job whose mean epoch time departs from the plan's by more than this share (and enough to move its
#: end by more than REPLAN_LATE of the plan's makespan) makes the planner replan.
REPLAN_DEVIATION = 0.10
#: Problems of at least this many (job, GPU count) epoch times plan in a child process, not a thread.
PROCESS_PLAN_MIN = 20_000


def departs(planned_s: float, seen: Sequence[float] | None, epochs_left: int, makespan_s: float) -> bool:
    """True when a job's observed mean epoch time settled away from the plan's (`settled`), by more than
    REPLAN_DEVIATION, and over its epochs_left moves its end by more than the slack lateness has
    (REPLAN_LATE of the plan's makespan). A job near its end, or one of many short epochs off by noise,
    changes no plan: replanning a thousand jobs for it costs more than it could gain."""
    mean = settled(seen, planned_s) if planned_s > 0 else None
    if mean is None or abs(mean / planned_s - 1) <= REPLAN_DEVIATION:
        return False
    return abs(mean - planned_s) * epochs_left > REPLAN_LATE * makespan_s


# --- the engine ---------------------------------------------------------------


class Dispatcher(Ingest, Actuation):
    """Follows the cluster and the executors, keeps job state, plans and dispatches."""

    def __init__(self, state: PlannerState, registry: str, profiler: str, policy: str = "", token: str | None = None,
                 checkpoint_root: str = "", start_overhead_s: float = 4.0, seed: int = 0,
                 policy_options: Mapping[str, object] | None = None, learn_profiles: bool = True,
                 tls=None, time_scale: float = 1.0, trial_timeout_s: float = TRIAL_TIMEOUT_S,
                 checkpoint_retention_s: float = 7 * 86400.0) -> None:
        import tempfile

        self.state = state
        self.registry_address = registry
        self.profiler_address = profiler
        self.default_policy = policy or default_policy()
        self.token = token
        self.tls = tls  # TlsConfig of the channels to the registry, profiler and executors (None: plaintext)
        self.checkpoint_root = checkpoint_root or f"{tempfile.gettempdir()}/omru-checkpoints"
        self.checkpoint_retention_s = checkpoint_retention_s  # (retention.py)
        self._swept = 0.0  # when the checkpoint root was last swept (monotonic seconds)
        self.prior_overhead_s = start_overhead_s
        self.time_scale = time_scale  # job seconds per wall second (an emulated cluster runs faster)
        self.overheads: list[float] = []
        self.seed = seed
        # makespans within 2 % count as equal (policies that know the option): epoch times vary
        # more than that from run to run, so such plans differ only in resizes and completions
        self.policy_options = {"makespan_tolerance": MAKESPAN_TOLERANCE, **(policy_options or {})}
        self.learn_profiles = learn_profiles  # plan with the epoch times observed, not only the profiled ones
        self.nodes = {}
        self.gpu_total = 0
        self._channels: dict[str, object] = {}
        self._followers: dict[str, asyncio.Task] = {}
        self._tasks: list[asyncio.Task] = []
        self._dirty = asyncio.Event()
        self._submissions = 0  # submissions being handled (`submitting`)
        self._job_watchers: set[asyncio.Queue] = set()
        self.owner: dict[Gpu, str] = {}  # GPU -> the job whose claim holds it (this planner writes claims)
        self._profiling: set[str] = set()
        self._measured: set[str] = set()  # attempts whose start overhead is measured
        self._refusals: dict[str, int] = {}  # job -> directives refused in a row
        self._job_locks: dict[str, asyncio.Lock] = {}  # a job's directive write and its events, one at a time
        #: job -> its move being written (`_follow` does not wait for them: a pass that dispatched a wave of
        #: starts must not hold up the next, which hands a GPU just released to the job planned there)
        self._acting: dict[str, asyncio.Task] = {}
        self._lock = asyncio.Lock()
        self._follow_needed = asyncio.Event()
        self.records: dict[str, JobRecord] = {}  # every job, as stored (this planner is their one writer)
        self.steps: list[Step] = []  # the plan in force, as steps to follow
        self._steps_of: dict[str, list[Step]] = {}  # the same, by job (_adopt keeps both)
        self._timing: dict[str, object] = {}  # job -> the epoch times the plan assumed (a core Job, `timing`)
        self._deviated: set[str] = set()  # jobs that made the planner replan since the last plan
        self._table_cache: dict[str, tuple] = {}  # job -> (inputs, its `timing`) of the last replan
        self._first_plan_stored = False  # the batch's first plan is in etcd (it alone needs LB_fluid)
        self._origin: float | None = None  # the stored origin (Unix seconds) once read
        self._plan_origin = 0.0  # when the plan in force starts (Unix seconds)
        self._plan_makespan = 0.0  # its makespan (plan seconds)
        self.deposed = asyncio.Event()  # a write was fenced off: another planner leads now
        self.standby_of = None  # the Election this planner campaigns in (None: it was started directly)
        self.started = asyncio.Event()  # elected and its state loaded: it acts (`leading`)
        self.plan_version = 0
        self._late_in = -1  # the plan version found late (and replanned on) last
        self._planning = False  # the core is making a plan (reconcile)
        self.policy_in_force = self.default_policy
        self._pools: dict[bool, object] = {}  # background? -> the child process large problems plan in
        self.trials = Trials(self, trial_timeout_s)  # profiling trials: allocations the planner writes too
        self.meter = PlannerMeter()  # what is counted as it happens (services/planner/metrics.py)

    # lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        plan = await self.state.plan()
        if plan:
            self.plan_version = plan["version"]
            self.policy_in_force = plan["policy"]
        self.records = {r.job_id: r for r in await self.state.jobs()}
        self.owner = await self.state.claims()
        await self.trials.recover()
        self._tasks = [asyncio.create_task(self._follow_cluster()), asyncio.create_task(self._replan_loop()),
                       asyncio.create_task(self._follow_loop())]
        self.started.set()
        self.poke()

    async def stop(self) -> None:
        """Stop acting (it may start again, as after a new election)."""
        await self.trials.stop()
        for t in [*self._tasks, *self._followers.values(), *self._acting.values()]:
            t.cancel()
        for t in [*self._tasks, *self._followers.values(), *self._acting.values()]:
            with contextlib.suppress(BaseException):
                await t
        for ch in self._channels.values():
            await ch.close()
        self._tasks, self._followers, self._channels, self.nodes = [], {}, {}, {}
        self._adopt([])
        self.started.clear()
        self.deposed.clear()
        for pool in self._pools.values():  # (a plan under way ends with its child, which then exits)
            pool.shutdown(wait=False, cancel_futures=True)
        self._pools = {}

    @property
    def leading(self) -> bool:
        """True once started (elected): only then does this planner write."""
        return self.started.is_set()

    def _broken(self, event: str, exc: Exception, **fields) -> None:
        """Log a failure of a loop that retries; a fenced write means this planner was deposed."""
        if isinstance(exc, Fenced):
            log.error("deposed", error=str(exc))
            self.deposed.set()
        log.warning(event, error=str(exc), **fields)

    def poke(self) -> None:
        """Ask for a reconcile soon."""
        self._dirty.set()

    def _channel(self, address: str):
        from services.common.channels import open_channel

        if address not in self._channels:
            self._channels[address] = open_channel(address, token=self.token, tls=self.tls)
        return self._channels[address]

    def _registry(self):
        from omru.v1 import registry_pb2_grpc

        return registry_pb2_grpc.RegistryServiceStub(self._channel(self.registry_address))

    def _executor(self, node_id: str):
        from omru.v1 import executor_pb2_grpc

        return executor_pb2_grpc.ExecutorServiceStub(self._channel(self.nodes[node_id].address))

    # job updates to watchers ---------------------------------------------------

    def watch_jobs(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self._job_watchers.add(q)
        return q

    def unwatch_jobs(self, q: asyncio.Queue) -> None:
        self._job_watchers.discard(q)

    async def _update(self, job_id: str, change) -> JobRecord | None:
        try:
            return self._stored(await self.state.update_job(job_id, change, self.records.get(job_id)))
        except st.IllegalMove as exc:  # a bug, not a reason to stop following the cluster: nothing stored
            log.error("illegal_move", job_id=job_id, error=str(exc))
            return self.records.get(job_id)

    def _stored(self, r: JobRecord | None) -> JobRecord | None:
        """Keep a record just written (never an older version) and tell the watchers."""
        if r is not None:
            if r.revision >= getattr(self.records.get(r.job_id), "revision", 0):
                self.records[r.job_id] = r
            for q in list(self._job_watchers):
                q.put_nowait(r)
        return r

    # submit / cancel -------------------------------------------------------------

    @contextlib.contextmanager
    def submitting(self):
        """Held while a submission is handled (validated, then stored): the replan waits for it."""
        self._submissions += 1
        try:
            yield
        finally:
            self._submissions -= 1

    async def submit(self, records: list[JobRecord]) -> tuple[bool, list[str]]:
        """Store new jobs (all or nothing); (created, ids that existed)."""
        try:
            created, existing = await self.state.create_jobs(records)
        except Fenced:
            self.deposed.set()
            raise
        if created:
            await self.state.set_origin(min(r.submitted_s for r in records))
            for r in await asyncio.gather(*(self.state.job(x.job_id) for x in records)):
                if r is not None:
                    self.records[r.job_id] = r
                    for q in list(self._job_watchers):
                        q.put_nowait(r)
            self.poke()
        return created, existing

    async def cancel(self, job_id: str, known: JobRecord | None = None) -> JobRecord | None:
        """Cancel the job (`known`: its record as just read, else read here); its record then."""
        r = known or await self.state.job(job_id)
        if r is None or r.terminal:
            return r
        await self._forget_later(r)
        await self._deallocate(r, r.gpus + r.target)  # its GPUs come back as its executors release them
        r = await self._update(job_id, lambda c: None if c.terminal else replace(
            c, state=st.CANCELLED, finished_s=time.time(), message="cancelled by a client"))
        self.poke()
        return r

    # planning ------------------------------------------------------------------------

    @property
    def overhead_s(self) -> float:
        """Measured mean start overhead (the prior until something was measured)."""
        return sum(self.overheads) / len(self.overheads) if self.overheads else self.prior_overhead_s

    @property
    def nodes(self) -> dict[str, object]:
        """node_id -> registry Node of every live node."""
        return self._nodes

    @nodes.setter
    def nodes(self, nodes: dict[str, object]) -> None:
        self._nodes, self._gpus = nodes, None

    def live_gpus(self) -> list[Gpu]:
        """Every live node's GPUs, sorted (kept until the nodes change: a pass over the plan asks each time)."""
        if self._gpus is None:
            self._gpus = sorted((n.node_id, g.index) for n in self._nodes.values() for g in n.gpus)
        return self._gpus

    def _adopt(self, steps: list[Step]) -> None:
        self.steps, self._steps_of = steps, {}
        for step in steps:
            self._steps_of.setdefault(step.job_id, []).append(step)

    def _due(self, r: JobRecord) -> bool:
        """True when the job's next planned step may begin at its coming epoch boundary."""
        return any(r.epochs_done + 1 >= s.after and set(s.gpus) != set(r.gpus) for s in self._steps_of.get(r.job_id, ()))

    def _departs(self, r: JobRecord, key: tuple[int, int]) -> bool:
        """True (once per plan and job) when the job's mean epoch time at a placement (GPUs, nodes)
        departs from the plan's (`departs`)."""
        timing = self._timing.get(r.job_id)
        if timing is None or key[0] not in timing.profile or r.job_id in self._deviated or not departs(
                timing.epoch_seconds(*key), r.observed.get(key), r.epochs - r.epochs_done, self._plan_makespan):
            return False
        self._deviated.add(r.job_id)
        return True

    def _epoch_s(self, job_id: str, gpus: Sequence[Gpu]) -> float | None:
        """The plan's epoch seconds of the job on these GPUs (None: not known)."""
        timing = self._timing.get(job_id)
        if timing is None or not 1 <= len(gpus) <= timing.max_gpus:
            return None
        return timing.epoch_seconds(len(gpus), len({g[0] for g in gpus}))

    def _worth_parking(self, j: Live, s: Step, holders: frozenset[str]) -> bool:
        """follow.py's `park`, on the plan's epoch times: True when the holders of the GPUs the job's step
        gains release them after its coming epoch boundary (sooner, it moves as a plain resize), but
        sooner after it than one more epoch where it runs would take beyond one epoch of the step
        (`wait < e_old - e_new`): stopped there, the job is further along when the step's GPUs are all
        free than it would be with one more epoch on what it holds."""
        r, now = self.records.get(j.job_id), time.time()
        if r is None or r.state != st.RUNNING or not r.progress_s:
            return False
        e_old, e_new = self._epoch_s(r.job_id, r.gpus), self._epoch_s(r.job_id, s.gpus)
        if e_old is None or e_new is None or e_new >= e_old:
            return False
        boundary = max(0.0, e_old - (now - r.progress_s) * self.time_scale)  # job seconds to it from now
        wait = 0.0
        for h in holders:
            hr = self.records.get(h)
            e_h = self._epoch_s(h, hr.gpus) if hr is not None and hr.state == st.RUNNING and hr.progress_s else None
            if e_h is None:
                return False  # (a holder starting, moving, or not a job: when it releases is not known)
            # it holds them until its first step off them, or its end
            until = min((x.after for x in self._steps_of.get(h, ()) if x.after > hr.epochs_done
                         and not set(x.gpus) & set(s.gpus)), default=hr.epochs)
            wait = max(wait, (until - hr.epochs_done) * e_h - (now - hr.progress_s) * self.time_scale)
        return boundary < wait < boundary + e_old - e_new

    def _ended_early(self, job_id: str) -> bool:
        """True when the job ended more than REPLAN_LATE of the plan's makespan before the plan had it end,
        leaving a GPU no later step of the plan uses: the plan did not know it would be free now, and
        left as it is it idles (GPUs the plan hands over to others are taken over early by following
        it), so the planner replans, as it does when reality falls behind the plan (`late`)."""
        timing, mine = self._timing.get(job_id), self._steps_of.get(job_id, ())
        ends = [s.start_s + s.epochs * timing.epoch_seconds(len(s.gpus), len({g[0] for g in s.gpus}))
                for s in mine if timing and len(s.gpus) in timing.profile]
        now = (time.time() - self._plan_origin) * self.time_scale
        if not ends or max(ends) - now <= REPLAN_LATE * self._plan_makespan:
            return False
        taken = {g for s in self.steps if s.job_id != job_id and s.after + s.epochs > getattr(
            self.records.get(s.job_id), "epochs_done", s.after + s.epochs) for g in s.gpus}
        if all(g in taken for s in mine for g in s.gpus):
            return False
        log.info("replan_on_early_end", job_id=job_id, planned_end_s=round(max(ends), 1), now_s=round(now, 1))
        return True

    async def _replan_loop(self) -> None:
        while True:
            await self._dirty.wait()
            began = time.monotonic()
            # a burst of changes makes one plan, and so do the calls of a submission made in several
            while (self._dirty.is_set() and time.monotonic() < began + REPLAN_QUIET_MAX_S) or (
                    self._submissions and time.monotonic() < began + SUBMISSIONS_WAIT_MAX_S):
                self._dirty.clear()
                await asyncio.sleep(REPLAN_QUIET_S)
            self._dirty.clear()
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._broken("reconcile_failed", exc)
                await asyncio.sleep(0.5)

    def _follow_soon(self) -> None:
        self._follow_needed.set()

    async def _follow_loop(self) -> None:
        """Carry the plan out as events come (bursts of events coalesce into one pass)."""
        while True:
            asked = await wait_event(self._follow_needed, FOLLOW_EVERY_S)  # and now and then, in case an event
            self._follow_needed.clear()  # was missed
            try:
                async with self._lock:
                    if not asked:
                        await self._drop_stale_claims()
                        await self._sweep_checkpoints()
                    await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._broken("follow_failed", exc)
                await asyncio.sleep(0.5)

    async def _sweep_checkpoints(self) -> list:
        """Remove the checkpoint folders whose retention ran out (retention.py), at most every
        SWEEP_EVERY_S (and a tenth of the retention), off the event loop; the folders removed."""
        if time.monotonic() - self._swept < min(SWEEP_EVERY_S, self.checkpoint_retention_s / 10):
            return []
        self._swept = time.monotonic()
        ended = {r.job_id: r.finished_s for r in self.records.values() if r.terminal and r.finished_s}
        removed = await asyncio.to_thread(retention.sweep, Path(self.checkpoint_root), await self._batch_folder(),
                                          ended, time.time(), self.checkpoint_retention_s)
        if removed:
            log.info("checkpoints_removed", folders=[str(p) for p in removed[:8]], count=len(removed))
        return removed

    async def _drop_stale_claims(self) -> None:
        """Forget the GPUs held, as this planner last read the claims, by jobs it does not run (claims it
        found at start, written by another writer) once those claims are gone from etcd: no event of its
        own jobs would tell it, and the GPUs would stay taken for good."""
        strangers = {g for g, job_id in self.owner.items() if job_id not in self.records and not is_trial_id(job_id)}
        if not strangers:
            return
        held = await self.state.claims()
        gone = [g for g in strangers if g not in held]
        for g in gone:
            del self.owner[g]
        if gone:
            log.info("stale_claims_dropped", gpus=gone[:8], count=len(gone))
            self.trials.freed()

    async def reconcile(self) -> None:
        """Replan: what waits and what runs (as committed history) go to the core; the new plan is followed."""
        self.meter.reconciled()
        async with self._lock:
            gpus = self.live_gpus()
            for r in [r for r in self.records.values() if r.state == st.PENDING]:
                if r.job_id in self._profiling:
                    continue
                if r.profile:
                    await self._update(r.job_id, lambda c: replace(c, state=st.WAITING) if c.state == st.PENDING else None)
                elif gpus:
                    self._profiling.add(r.job_id)
                    asyncio.get_running_loop().create_task(self._profile(r, len(gpus)))
            records = [r for r in self.records.values() if not r.terminal and r.profile
                       and r.state in (st.WAITING, st.STARTING, st.RUNNING, st.RESIZING)]
            if not records or not gpus:
                return
            problem, base, timings = self._problem(records, gpus)
            incumbent = planning.incumbent(self._steps_of, problem, base, gpus,
                                           (time.time() - self._plan_origin) * self.time_scale) \
                if problem is not None and self.steps else ()
            attempts = {r.job_id: r.attempt for r in records}
        self._planning = True
        try:
            plan = await self._plan(problem, base, gpus, incumbent) if problem is not None else None
        finally:
            self._planning = False
        async with self._lock:
            if plan is not None:
                # jobs that started or moved while the core planned keep the steps they follow
                moved = {j for j, a in attempts.items() if j in self.records and self.records[j].attempt != a}
                self._adopt([x for x in plan["steps"] if x.job_id not in moved]
                            + [x for x in self.steps if x.job_id in moved])
                self._timing = timings
                self._deviated = set()
                # (its clock starts now: what ran while the core planned is not lateness)
                self._plan_origin, self._plan_makespan = time.time(), plan["makespan_s"]
                self.plan_version += 1
                plan["record"]["version"] = self.plan_version
                # the batch's first plan is the first one that covers every job (none still profiling)
                unplanned = [r for r in self.records.values() if r.state in (st.PENDING, st.PROFILING)]
                first = not unplanned and not await self._first_planned()
                await self.state.put_plan(plan["record"], first=first)
                if first:  # its lower bound (the report's) comes when computed: it is a large linear program
                    self._first_plan_stored = True
                    self._tasks.append(asyncio.get_running_loop().create_task(self._bound_first_plan(problem)))
                for q in list(self._job_watchers):  # a plan change is news too
                    for r in records:
                        q.put_nowait(self.records.get(r.job_id, r))
            await self._follow()

    async def _follow(self) -> None:
        """Begin every planned step whose time has really come (follow.py); replan when none can while
        GPUs idle and jobs wait for nothing that runs."""
        gpus = self.live_gpus()
        owned: dict[str, list[Gpu]] = {}
        for g, job_id in self.owner.items():
            owned.setdefault(job_id, []).append(g)
        live, booking = {}, []
        for r in self.records.values():
            if r.awaiting and r.job_id not in self._acting and any(g not in self.owner for g in r.awaiting):
                booking.append(r.job_id)  # (parked: a GPU it awaits came free)
            mine = tuple(owned.pop(r.job_id, ()))
            if r.terminal or not r.profile or r.state not in (st.WAITING, st.STARTING, st.RUNNING, st.RESIZING):
                if mine:
                    owned[r.job_id] = list(mine)
                continue
            waiting, moving = r.state == st.WAITING, r.state in (st.STARTING, st.RESIZING)
            # an attempt that released every GPU it ran on ended (finished, or stopped on its own): its
            # outcome comes on rank 0's node's stream, which may lag the others'; nothing moves it meanwhile
            ended = r.state == st.RUNNING and not mine
            held = mine if waiting or ended else tuple(dict.fromkeys(r.gpus + r.target + mine))
            live[r.job_id] = Live(r.job_id, waiting, moving or ended or r.job_id in self._acting, held, r.epochs_done,
                                  None if waiting else (r.target if moving else r.gpus))
        for job_id, mine in owned.items():  # ended (or not the planner's) but not released yet: untouchable
            live[job_id] = Live(job_id, True, True, tuple(mine), 0, ended=True)
        if any(s.job_id not in live for s in self.steps):  # the steps of jobs that ended are done
            self.steps = [s for s in self.steps if s.job_id in live]
        moves = follow(self.steps, live, gpus, self._worth_parking)
        for m in moves:
            self._acting[m.job_id] = t = asyncio.get_running_loop().create_task(self._act(m))
            t.add_done_callback(functools.partial(self._acted, m.job_id))
        for job_id in booking:  # parked jobs take the GPUs they await as their holders release them
            self._acting[job_id] = t = asyncio.get_running_loop().create_task(self._book(job_id))
            t.add_done_callback(functools.partial(self._acted, job_id))
        if self._planning:
            return  # (the plan under way is the replan the checks below would ask for)
        if not moves and live and all(j.waiting for j in live.values()) and gpus and not self.owner \
                and not self._acting:
            self.poke()  # nothing runs or holds a GPU, and nothing planned can start: the plan is spent or stale
        elif self.steps and not self._dirty.is_set() and self._late_in != self.plan_version:
            now = (time.time() - self._plan_origin) * self.time_scale
            # (a job this pass moves is taking its step: not behind, though `live` saw it waiting)
            behind = [s for s in late(self.steps, live, now, REPLAN_LATE * self._plan_makespan)
                      if s.job_id not in self._acting]
            if behind:  # (once per plan: a replan that changes nothing must not spin)
                self._late_in = self.plan_version
                j = live.get(behind[0].job_id)
                log.info("replan_on_lateness", job_id=behind[0].job_id, planned_s=round(behind[0].start_s, 1),
                         now_s=round(now, 1), steps=len(behind), epochs_done=j.epochs_done if j else None,
                         after=behind[0].after, blockers=dict(list(blockers(self.steps, live, behind[0]).items())[:4]))
                self.poke()

    def _problem(self, records: list[JobRecord], gpus: list[Gpu]):
        """problem.problem for these records now (each job's timing kept from the last replan while its
        inputs are unchanged: tables over a large cluster are long)."""
        cache: dict = {}
        out = planning.problem(records, gpus, lambda r, cluster: self._timing_of(r, cluster, cache), time.time(),
                              self.time_scale, self.overhead_s, self.seed, self.policy_options)
        self._table_cache = cache
        return out

    def _timing_of(self, r: JobRecord, cluster, cache: dict):
        """The job's `timing`, kept from the last replan while its inputs are unchanged (tables over a
        large cluster are long)."""
        observed = tuple((key, tuple(v)) for key, v in r.observed.items()) if self.learn_profiles else ()
        key = (cluster, tuple(r.profile.items()), observed, r.placement, r.spec.get("min_gpus", 1), r.max_gpus)
        kept = self._table_cache.get(r.job_id)
        if kept is None or kept[0] != key:
            kept = (key, timing(r, cluster, self.learn_profiles))
        cache[r.job_id] = kept
        return kept[1]

    async def _first_planned(self) -> bool:
        """True once the batch's first plan is stored (read from etcd once, then known)."""
        if not self._first_plan_stored:
            self._first_plan_stored = await self.state.first_plan() is not None
        return self._first_plan_stored

    async def _bound_first_plan(self, problem) -> None:
        from services.planner.core.bounds import fluid

        try:  # (only the report needs it: at low CPU priority, beside the replans)
            await self.state.bound_first_plan(await self._run(fluid, problem, background=True))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._broken("lower_bound_failed", exc)

    async def _plan(self, problem, base: dict[str, int], gpus: list[Gpu], incumbent=()) -> dict | None:
        """Plan with the policy in force (`_run`; `incumbent`: the plan in force, see plan_problem);
        {"steps": [Step], "record": the plan to store}."""
        from services.planner.core.model import PlanningError

        name = self.policy_in_force
        committed = problem.options["committed"]
        began = time.monotonic()
        try:
            result, kept = await self._run(planning.plan_problem, name, incumbent, problem)
        except PlanningError as exc:
            log.error("planning_failed", error=str(exc))
            return None
        wall = time.monotonic() - began
        self.meter.planned(wall)
        seconds = wall * self.time_scale  # in job seconds
        log.info("planned", policy=name, jobs=len(problem.jobs), running=len(committed), plan_s=round(wall, 4),
                 makespan_s=round(result.makespan_s, 1), kept=kept)
        steps = planning.steps(result, gpus, base, {j.id: self.records[j.id].max_gpus for j in problem.jobs})
        return {"steps": steps, "record": planning.record(result, name, gpus, seconds, self.overhead_s),
                "makespan_s": result.makespan_s}

    async def _run(self, fn, *args, background: bool = False):
        """fn(*args) (the last one the problem) in a thread, or for a large problem in a child process,
        spawned once: the plans' own, or with `background` another one at low CPU priority (the first
        plan's lower bound, 21 CPU seconds at 1,000 jobs, must not slow the replans and the control
        loop on a busy machine)."""
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        problem = args[-1]
        if len(problem.jobs) * problem.cluster.gpus < PROCESS_PLAN_MIN:
            return await asyncio.to_thread(fn, *args)
        if self._pools.get(background) is None:
            import multiprocessing

            self._pools[background] = ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_child, initargs=(background,))
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pools[background], fn, *args)
        except BrokenProcessPool:  # the child died (killed, out of memory): the next call starts another
            self._pools.pop(background, None)
            raise

    async def _profile(self, r: JobRecord, max_gpus: int) -> None:
        """Ask the profiler for the job's epoch times; the job waits (or fails, saying why)."""
        import grpc

        from omru.v1 import profiler_pb2, profiler_pb2_grpc
        from services.planner import convert

        stub = profiler_pb2_grpc.ProfilerServiceStub(self._channel(self.profiler_address))
        spec = convert.record_spec(r)
        try:
            await self._update(r.job_id, lambda c: replace(c, state=st.PROFILING) if c.state == st.PENDING else None)
            profile = None
            try:
                got = await stub.GetProfile(profiler_pb2.GetProfileRequest(job=spec), timeout=5)
                profile = got.profile
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            if profile is None:
                async for reply in stub.Profile(profiler_pb2.ProfileRequest(job=spec, max_gpus=max_gpus), timeout=600):
                    p = reply.progress
                    if p.state == profiler_pb2.PROFILE_STATE_FAILED:
                        raise RuntimeError(p.message or "profiling failed")
                    if p.state == profiler_pb2.PROFILE_STATE_DONE:
                        profile = p.profile
            points = {}
            for pt in profile.points if profile is not None else ():
                if pt.gpus not in points or pt.nodes <= 1:
                    points[pt.gpus] = pt.epoch_seconds
            if not points:
                raise RuntimeError("the profiler returned no epoch times")
            await self._update(r.job_id, lambda c: replace(c, state=st.WAITING, profile=points)
                               if c.state in (st.PENDING, st.PROFILING) else None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            await self._update(r.job_id, lambda c: None if c.terminal else replace(
                c, state=st.FAILED, message=f"no profile: {detail}", finished_s=time.time()))
        finally:
            self._profiling.discard(r.job_id)
            self.poke()


def _child(background: bool) -> None:
    """A planning child process: it dies with the planner; a background one yields the CPU to others."""
    from services.common.cluster import die_with_parent

    die_with_parent()
    if background:
        os.nice(10)




def default_policy() -> str:
    """`omru` when the core registers it, else `omru-ga`."""
    from services.planner.core import registry

    names = registry.names()
    return "omru" if "omru" in names else "omru-ga"
