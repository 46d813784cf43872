"""plan_problem: a large problem plans in child processes (no GIL shared with the event loop), the same
plan as in a thread, the first plan's lower bound in one of low CPU priority, and the children end with the
dispatcher; a replan keeps the plan in force unless it
finds a better one."""

from __future__ import annotations

import os
import time

import pytest

from services.planner import dispatcher as dispatch
from services.planner.problem import plan_problem
from services.planner.core.bounds import fluid
from services.planner.core.model import Cluster, Job, PlanningInput


def problem() -> PlanningInput:
    jobs = tuple(Job(id=f"j{i}", epochs=3 + i, profile={1: 10.0 + i, 2: 6.0 + i, 3: 5.0 + i, 4: 4.5 + i})
                 for i in range(5))
    return PlanningInput(jobs=jobs, cluster=Cluster.of(4, 2), seed=0, options={"committed": (), "start_s": 0.0},
                         resize_cost_s=2.0)


async def test_a_large_problem_plans_in_a_child_process_the_same_plan_and_the_children_end_on_stop(monkeypatch):
    p = problem()
    in_thread, _ = plan_problem("omru", (), p)
    d = dispatch.Dispatcher(None, registry="", profiler="", policy="omru")
    monkeypatch.setattr(dispatch, "PROCESS_PLAN_MIN", 1)
    in_child, _ = await d._run(plan_problem, "omru", (), p)
    pool = d._pools[False]
    assert (in_child.makespan_s, in_child.segments) == (in_thread.makespan_s, in_thread.segments)
    again, _ = await d._run(plan_problem, "omru", (), p)
    assert again.makespan_s == in_child.makespan_s and d._pools[False] is pool  # spawned once
    bound = await d._run(fluid, p, background=True)  # beside the plans, at low CPU priority
    assert 0 < bound <= in_child.makespan_s
    children = list(pool._processes) + list(d._pools[True]._processes)
    assert len(children) == 2 and os.getpid() not in children
    assert [os.getpriority(os.PRIO_PROCESS, pid) - os.getpriority(os.PRIO_PROCESS, 0) for pid in children] == [0, 10]
    await d.stop()
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in children)


def _alive(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:  # a zombie (Z) has ended
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_replan_keeps_the_plan_in_force_unless_it_finds_one_better_by_more_than_the_tolerance():
    from services.planner.core.model import Segment

    p = problem()
    p = PlanningInput(p.jobs, p.cluster, seed=0, options={**p.options, "makespan_tolerance": 0.02},
                      resize_cost_s=p.resize_cost_s)
    fresh, kept = plan_problem("omru", (), p)
    assert not kept
    # the plan in force, as the dispatcher hands it over (its segments' times only order them)
    incumbent = tuple(Segment(s.job, s.start_s, s.start_s, s.gpus, s.epochs) for s in fresh.segments)
    again, kept = plan_problem("omru", incumbent, p)
    assert kept and again.makespan_s == pytest.approx(fresh.makespan_s)
    # one that runs every job alone on one GPU, one after the other, is not kept
    serial, t = [], 0.0
    for j in p.jobs:
        serial.append(Segment(j.id, t, t, (0,), j.epochs))
        t += j.epochs * j.profile[1]
    worse, kept = plan_problem("omru", tuple(serial), p)
    assert not kept and worse.makespan_s == pytest.approx(fresh.makespan_s)
