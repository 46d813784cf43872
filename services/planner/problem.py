"""What the planner hands the core, and what it takes back from it. Pure.

`problem` turns the live jobs into a core PlanningInput: each job's epochs
left, with its learned epoch times (learn.py `timing`) plus the measured start
overhead spread over them, and every running job's epoch under way, on the
GPUs it holds, as committed history (a job goes on there after it at no
restart cost; anywhere else it pays the resize cost). `incumbent` gives the
plan in force on the same terms, `plan_problem` (run in a thread or a child
process) plans and keeps the incumbent unless the new plan is better by more
than the makespan tolerance, and `steps` turns the plan into the steps the
dispatcher follows (follow.py) and the record stored in etcd.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Sequence

from services.planner import state as st
from services.planner.follow import Step
from services.planner.state import JobRecord

Gpu = tuple[str, int]

#: Wall seconds a policy that searches (omru's `deadline_s`) may take: a replan while jobs run, and a plan
#: of a cluster where nothing runs yet. While the core plans, jobs start and move on the plan in force, and
#: the new plan, made from a snapshot, fits less of what runs the longer it took.
REPLAN_DEADLINE_S = 1.0
PLAN_DEADLINE_S = 5.0


def cluster_of(gpus: Sequence[Gpu]):
    """The core's Cluster of these GPUs (sorted: each node's GPUs in a row), nodes as they are."""
    from services.planner.core.model import Cluster

    sizes: dict[str, int] = {}
    for node, _ in gpus:
        sizes[node] = sizes.get(node, 0) + 1
    return Cluster.of_sizes(list(sizes.values()))


def problem(records: Sequence[JobRecord], gpus: Sequence[Gpu], timing_of: Callable, now_s: float,
            time_scale: float, overhead_s: float, seed: int, options: Mapping):
    """(PlanningInput with the running jobs' current epochs as committed history, epochs done before
    each job's first planned step, each job's timing); the input is None when every job is in its last
    epoch. `timing_of(record, cluster)`: the job's learned timing; `now_s`: Unix seconds; `time_scale`:
    job seconds per wall second; `options`: the policy's."""
    from services.planner.core.model import Job, PlanningInput, Segment

    cluster = cluster_of(gpus)
    index = {g: i for i, g in enumerate(gpus)}
    timings, jobs, committed, base = {}, [], [], {}
    for r in records:
        timings[r.job_id] = timing = timing_of(r, cluster)
        left = max(r.epochs - r.epochs_done, 0)
        base[r.job_id] = r.epochs_done
        held = r.target if r.state in (st.STARTING, st.RESIZING) else r.gpus
        running = r.state != st.WAITING and held and all(g in index for g in held)
        where = (len(held), len({g[0] for g in held})) if running else None
        if running and left:  # its epoch under way ends at its next boundary, on what it holds
            tau = timing.epoch_seconds(*where)
            elapsed = (now_s - r.progress_s) * time_scale if r.state == st.RUNNING and r.progress_s else 0.0
            until = max(tau - elapsed, 0.05 * tau) + (overhead_s if r.state != st.RUNNING else 0.0)
            committed.append(Segment(r.job_id, 0.0, until, tuple(sorted(index[g] for g in held)), 1))
            left -= 1
            base[r.job_id] += 1
        if left <= 0:
            continue
        share = overhead_s / left  # a (re)start, spread over the epochs left; none where it runs now
        profile = {g: t + share for g, t in timing.profile.items()}
        placement = {key: t + share for key, t in timing.placement.items()}
        if running:
            profile[where[0]] = timing.profile[where[0]]
            if where in placement:
                placement[where] = timing.placement[where]
        jobs.append(Job(id=r.job_id, epochs=left, profile=profile, placement=placement))
    if not jobs:
        return None, base, timings
    options = {"deadline_s": REPLAN_DEADLINE_S if committed else PLAN_DEADLINE_S, **options,
               "committed": tuple(committed), "start_s": 0.0}
    return (PlanningInput(jobs=tuple(jobs), cluster=cluster, seed=seed, options=options,
                          resize_cost_s=overhead_s), base, timings)


def incumbent(steps_of: Mapping[str, Sequence[Step]], problem, base: Mapping[str, int], gpus: Sequence[Gpu],
              shift_s: float) -> tuple:
    """The plan in force (`steps_of`: each job's steps, planned `shift_s` plan seconds ago) on the
    problem's terms: each job's steps cut to the epochs it has left after what it runs now, on GPU
    indices, at their planned times from now; () when that plan does not cover the problem (a job it
    does not plan, a GPU gone)."""
    from services.planner.core.model import Segment

    if not steps_of:
        return ()
    index = {g: i for i, g in enumerate(gpus)}
    out = []
    for job in problem.jobs:
        first, covered = base[job.id], 0
        for s in sorted(steps_of.get(job.id, ()), key=lambda s: s.after):
            lo, hi = max(s.after, first), min(s.after + s.epochs, first + job.epochs)
            if hi <= lo:
                continue
            if any(g not in index for g in s.gpus):
                return ()
            start = max(s.start_s - shift_s, 0.0)
            out.append(Segment(job.id, start, start, tuple(sorted(index[g] for g in s.gpus)), hi - lo))
            covered += hi - lo
        if covered != job.epochs:
            return ()
    return tuple(out)


def plan_problem(name: str, incumbent, problem):
    """(plan, kept): policy `name`'s plan, replayed after the committed history when it has any or breaks
    a rule; or, kept True, the `incumbent` segments (the plan in force, from now) replayed the same way
    when the new plan is not better by more than the makespan tolerance: a replan made in a hurry
    (deadline_s) must not trade a plan the cluster follows for a worse one, nor restart jobs for noise."""
    from services.planner.core import registry, validate
    from services.planner.core.model import Plan
    from services.planner.core.simulator import replay

    committed = problem.options.get("committed", ())
    result = registry.plan(name, problem)
    if committed or validate.violations(result, problem):  # as the cluster runs it, after what runs
        result = replay(result, problem, committed)
    if incumbent:
        kept = replay(Plan(result.policy, tuple(incumbent)), problem, committed)
        tolerance = problem.options.get("makespan_tolerance", 0.0)
        if kept.makespan_s <= result.makespan_s * (1 + tolerance) and not validate.violations(kept, problem):
            return kept, True
    return result, False


def steps(result, gpus: Sequence[Gpu], base: Mapping[str, int], max_gpus: Mapping[str, int]) -> list[Step]:
    """The plan's segments as steps to follow, on GPU ids, each after the epochs its job has done by
    then (`base`: before its first step)."""
    done = dict(base)
    out = []
    for s in sorted(result.segments, key=lambda s: (s.start_s, s.job)):
        # a policy may spread a job wider than it may run (its table only discourages it): it runs
        # on the first max_gpus of them, which it can, and the rest idle
        cap = max_gpus.get(s.job) or len(s.gpus)
        out.append(Step(s.job, tuple(gpus[i] for i in s.gpus[:cap]), done[s.job], s.start_s, s.epochs))
        done[s.job] += s.epochs
    return out


def record(result, name: str, gpus: Sequence[Gpu], planning_seconds: float, overhead_s: float) -> dict:
    """The plan as stored (times from its creation, now, once planned; version set when it is adopted)."""
    return {
        "version": 0, "policy": name, "created_unix_s": time.time(), "planning_seconds": planning_seconds,
        "makespan_s": result.makespan_s, "overhead_s": overhead_s, "lower_bound_s": 0.0,
        "segments": [{"job": s.job, "start_s": s.start_s, "end_s": s.end_s,
                      "gpus": [list(gpus[i]) for i in s.gpus], "epochs": s.epochs} for s in result.segments],
    }
