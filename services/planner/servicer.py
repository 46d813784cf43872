"""PlannerService: thin: convert (convert.py), hand to the dispatcher, convert back."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import replace

import grpc

from omru.spec import MAX_NAME, shown
from omru.v1 import common_pb2, planner_pb2, planner_pb2_grpc
from services.common import authz
from services.common.aio import wait_event
from services.common.errors import abort, abort_invalid, abort_not_found, grpc_errors
from services.executor.worker.spec import SpecError
from services.planner import convert, logs, report, trials
from services.planner import state as st
from services.planner.dispatcher import Dispatcher
from services.planner.state import JobRecord
from services.registry import validation


ELECTED_WAIT_S = 10.0  # the longest a write waits for this planner's election and start


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    """omru.v1.PlannerService over one `Dispatcher`."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    async def _leading(self, context) -> None:
        """UNAVAILABLE (retry elsewhere) unless this planner leads: only the leader writes.

        A planner elected (or being elected, no other leader) but still loading
        its state makes the call wait for it, within the call's deadline."""
        if self.dispatcher.leading:
            return
        election = self.dispatcher.standby_of
        leader = await election.leader() if election is not None else ""
        left = context.time_remaining()
        until = time.monotonic() + min(ELECTED_WAIT_S, (left if left is not None else ELECTED_WAIT_S) - 0.5)
        while election is not None and leader in ("", election.identity) and time.monotonic() < until:
            await wait_event(self.dispatcher.started, 0.5)
            if self.dispatcher.leading:
                return
            leader = await election.leader()
        await abort(context, grpc.StatusCode.UNAVAILABLE,
                    f"this planner is on standby; the leader is {leader or 'being elected'}")

    @grpc_errors
    async def SubmitJobs(self, request, context):
        from services.planner.core import registry

        await self._leading(context)
        if request.policy and request.policy not in registry.names():
            await abort_invalid(context, "policy", f"unknown policy {shown(request.policy)}; known: {', '.join(registry.names())}")
        if not request.jobs:
            await abort_invalid(context, "jobs", "is empty")
        with self.dispatcher.submitting():  # (a replan waits for the calls of a submission being handled)
            problems, records = await self._validate(request)
            if problems:
                await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
            if request.policy:
                self.dispatcher.policy_in_force = request.policy
            new = [r for r in records if r is not None]
            if new:
                created, existing = await self.dispatcher.submit(new)
                if not created:  # raced with another submit of the same ids: compare again
                    problems, _ = await self._validate(request)
                    if problems:
                        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
                    await self.dispatcher.submit([r for r in new if r.job_id not in existing])
        return planner_pb2.SubmitJobsResponse(job_ids=[j.job_id for j in request.jobs])

    async def _validate(self, request) -> tuple[list[str], list[JobRecord | None]]:
        """Every problem of the request (job and field named), and a record per new job (None: stored already)."""
        hints = {p.job_id: dict(p.epoch_seconds) for p in request.profiles}
        placements = {p.job_id: tuple((x.gpus, x.nodes, x.epoch_seconds) for x in p.placements) for p in request.profiles}
        gpus = len(self.dispatcher.live_gpus()) or self.dispatcher.gpu_total
        problems: list[str] = []
        ids, profiled = {spec.job_id for spec in request.jobs}, set()
        for i, p in enumerate(request.profiles):  # a profile of no job, or a second one, would be dropped
            if p.job_id not in ids:
                problems.append(f"profiles[{i}].job_id: {shown(p.job_id)} is not the job_id of any of jobs")
            elif p.job_id in profiled:
                problems.append(f"profiles[{i}].job_id: {shown(p.job_id)} has a profile already")
            profiled.add(p.job_id)
        records: list[JobRecord | None] = []
        seen: dict[str, common_pb2.JobSpec] = {}
        now, owner = time.time(), authz.owner_of(authz.caller())
        for i, spec in enumerate(request.jobs):
            where = f"jobs[{i}] ({shown(spec.job_id)})"
            try:
                job = convert.workload_job(spec, hints.get(spec.job_id))
            except SpecError as exc:
                problems.append(f"{where}: {exc}")
                records.append(None)
                continue
            if trials.is_trial_id(spec.job_id):
                problems.append(f"{where}: job_id: ends like a profiling trial's id (<job>.prof-g<n>-<8 hex>), "
                                "which the planner keeps for its trials")
            if gpus and job.spec.min_gpus > gpus:
                problems.append(f"{where}: min_gpus: needs {job.spec.min_gpus} GPUs, the cluster has {gpus}")
            if gpus and job.max_gpus > gpus:
                problems.append(f"{where}: max_gpus: {job.max_gpus} GPUs asked, the cluster has {gpus}")
            for g, t in job.profile.items():
                if g < 1 or not 0 < t < math.inf:
                    problems.append(f"{where}: profile: {t!r} seconds per epoch on {g} GPUs")
            for g, k, t in placements.get(spec.job_id, ()):
                if not 1 <= k <= g or not 0 < t < math.inf:
                    problems.append(f"{where}: profile placement: {t!r} seconds per epoch on {g} GPUs over {k} nodes")
            if spec.job_id in seen:
                if seen[spec.job_id] != spec:
                    problems.append(f"{where}: job_id given twice in the request with different specs")
                records.append(None)
                continue
            seen[spec.job_id] = spec
            stored = self.dispatcher.records.get(spec.job_id)
            if stored is not None:
                if convert.record_spec(stored) != convert.job_spec(job):
                    problems.append(f"{where}: job_id already submitted with a different spec")
                records.append(None)
                continue
            records.append(JobRecord(spec=job.spec.to_dict(), max_gpus=job.max_gpus, profile=dict(job.profile),
                                     placement=placements.get(spec.job_id, ()), state=st.PENDING, submitted_s=now,
                                     owner=owner))
        return problems, records

    @grpc_errors
    async def CancelJob(self, request, context):
        problem = validation.id_problem("job_id", request.job_id)
        if problem:
            await abort_invalid(context, *problem)
        await self._leading(context)
        r = await self.dispatcher.state.job(request.job_id)
        await _own(context, "CancelJob", r, request.job_id)  # (NOT_FOUND without it)
        r = await self.dispatcher.cancel(request.job_id, r)
        return planner_pb2.CancelJobResponse(state=common_pb2.JobState.Value(f"JOB_STATE_{r.state}"))

    @grpc_errors
    async def GetPlan(self, request, context):
        return planner_pb2.GetPlanResponse(plan=convert.plan(await self.dispatcher.state.plan()))

    @grpc_errors
    async def WatchJobs(self, request, context):
        await _check_ids(context, request.job_ids)
        wanted = set(request.job_ids)
        q = self.dispatcher.watch_jobs()
        try:
            version = self.dispatcher.plan_version
            for r in await self.dispatcher.state.jobs():
                if (not wanted or r.job_id in wanted) and r.revision > request.after_revision:
                    yield planner_pb2.WatchJobsResponse(update=convert.job_update(r, version))
            while True:
                r = await q.get()
                if r is not None and (not wanted or r.job_id in wanted) and r.revision > request.after_revision:
                    yield planner_pb2.WatchJobsResponse(update=convert.job_update(r, self.dispatcher.plan_version))
        finally:
            self.dispatcher.unwatch_jobs(q)

    @grpc_errors
    async def ListJobs(self, request, context):
        # From etcd, not the dispatcher's memory: a standby planner answers with what the leader stored.
        for i, state in enumerate(request.states):
            if state == common_pb2.JOB_STATE_UNSPECIFIED or state not in common_pb2.JobState.values():
                await abort_invalid(context, f"states[{i}]", f"{state} is not a job state")
        await _check_ids(context, request.job_ids)
        states = {common_pb2.JobState.Name(s).removeprefix("JOB_STATE_") for s in request.states}
        wanted = set(request.job_ids)
        version = self.dispatcher.plan_version
        records = await self.dispatcher.state.jobs()  # by job_id (etcd's key order)
        return planner_pb2.ListJobsResponse(
            jobs=[convert.job_update(r, version) for r in records
                  if (not states or r.state in states) and (not wanted or r.job_id in wanted)],
            revision=max((r.revision for r in records), default=0))

    @grpc_errors
    async def GetReport(self, request, context):
        figures, holds, first, origin = await build_report(self.dispatcher)
        return planner_pb2.GetReportResponse(report=convert.report_proto(figures, holds, first, origin))

    @grpc_errors
    async def RunTrial(self, request, context):
        """One profiling trial (services/planner/trials.py); only the leader runs trials."""
        from services.executor import convert as executor_convert
        from services.executor.supervisor import DirectiveError

        if not request.HasField("job"):
            await abort_invalid(context, "job", "is required")
        try:
            convert.workload_job(request.job)
            executor_convert.profile_spec(request.profile, "profile")
        except SpecError as exc:
            await abort_invalid(context, f"job.{exc.field}", str(exc).split(": ", 1)[1])
        except DirectiveError as exc:
            await abort_invalid(context, exc.field, str(exc).split(": ", 1)[1])
        problem = validation.text_problem("gpu_kind", request.gpu_kind, MAX_NAME)
        if problem:
            await abort_invalid(context, *problem)
        if request.gpus < 1:
            await abort_invalid(context, "gpus", f"{request.gpus} is not a GPU count (1 or more)")
        await self._leading(context)
        d = self.dispatcher
        for _ in range(20):  # a planner just elected lists the cluster first
            if d.nodes:
                break
            await asyncio.sleep(0.1)
        kind = request.gpu_kind or trials.main_kind(d.nodes)
        have = trials.kinds(d.nodes).get(kind, 0)
        if request.gpus > have:
            where = f"GPU kind {shown(kind)}" if request.gpu_kind else f"the cluster's main GPU kind {shown(kind)}"
            await abort_invalid(context, "gpus", f"{request.gpus} is more than the {have} GPUs of {where}")
        try:
            m = await d.trials.run(request.job, request.gpus, kind, request.profile, context.time_remaining())
        except trials.TrialError as exc:
            await abort(context, getattr(grpc.StatusCode, exc.code), str(exc))
        return planner_pb2.RunTrialResponse(gpus=m.gpus, nodes=m.nodes, iter_seconds=m.iter_seconds, steps=m.steps,
                                            epoch_seconds=m.epoch_seconds, trial_id=m.trial_id)

    @grpc_errors
    async def GetJobLogs(self, request, context):
        problem = validation.id_problem("job_id", request.job_id)
        if problem:
            await abort_invalid(context, *problem)
        rank = request.rank if request.HasField("rank") else None
        for name, value in (("attempt", request.attempt), ("rank", rank)):
            if value is not None and value < 0:
                await abort_invalid(context, name, f"{value} is negative")
        await _own(context, "GetJobLogs", await self.dispatcher.state.job(request.job_id), request.job_id)
        d = self.dispatcher
        chunks = logs.read(d.registry_address, request.job_id, request.attempt, rank, request.follow,
                           context.time_remaining(), token=d.token, tls=d.tls)
        try:
            async with contextlib.aclosing(chunks):  # (a client gone: the executors' calls end now)
                async for c in chunks:
                    yield planner_pb2.GetJobLogsResponse(node_id=c.node_id, attempt=c.attempt,
                                                         attempt_id=c.attempt_id, rank=c.rank, data=c.data)
        except logs.NoLogs as exc:
            await abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except logs.BadRequest as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except logs.NodeFailed as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, f"logs could not be read: {exc}")


async def _own(context, method: str, record: JobRecord | None, job_id: str) -> None:
    """NOT_FOUND without the job; PERMISSION_DENIED unless the caller owns it or is an admin."""
    if record is None:
        await abort_not_found(context, "job_id", job_id)
    p = authz.caller()
    if not authz.may_act_on(p, record.owner):
        whose = f"belongs to {shown(record.owner)}" if record.owner else "has no recorded owner"
        await abort(context, grpc.StatusCode.PERMISSION_DENIED,
                    f"{method}: {p} may not act on job {shown(job_id)}: it {whose} (only its owner or an admin may)")


async def _check_ids(context, job_ids) -> None:
    """INVALID_ARGUMENT for the first malformed id of job_ids (an id no job can have would match nothing)."""
    for i, job_id in enumerate(job_ids):
        problem = validation.id_problem(f"job_ids[{i}]", job_id)
        if problem:
            await abort_invalid(context, *problem)


async def build_report(d: Dispatcher) -> tuple[report.Figures, list, dict | None, float]:
    """(figures, holds, first plan, origin) of the batch so far, from the stored executor events and the
    first plan; each job's state and failure reason from its record.

    Only the planner's own jobs count: profiling trials (allocations this
    planner wrote for the profiler, their events not stored) are not part of
    the batch."""
    s = d.state
    events, first, origin, jobs = await asyncio.gather(s.events(), s.first_plan(), s.origin(), s.jobs())
    origin = origin if origin is not None else time.time()
    known = {r.job_id for r in jobs}
    events = [e for e in events if e.job_id in known]
    figures = report.figures(events, gpus=max(d.gpu_total, 1), origin_s=origin, plan=convert.planned_segments(first),
                             plan_origin_s=first["created_unix_s"] if first else None,
                             policy=first["policy"] if first else d.policy_in_force, now_s=time.time(),
                             jobs=sorted(known), lower_bound_s=_lower_bound(first, origin))
    records = {r.job_id: r for r in jobs}
    figures = replace(figures, jobs=tuple(
        replace(j, state=records[j.job_id].state, message=records[j.job_id].message if records[j.job_id].state == st.FAILED
                else "") for j in figures.jobs))
    return figures, report.holds(events, now_s=time.time()), first, origin


def _lower_bound(first: dict | None, origin: float) -> float:
    """LB_fluid of the first plan's problem, after origin (0 when unknown)."""
    if not first or not first.get("lower_bound_s"):
        return 0.0
    return first["lower_bound_s"] + first["created_unix_s"] - origin
