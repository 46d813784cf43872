"""Replaying plans the way the cluster would run them.

`replay(plan, problem)`: keep the plan's order of segments on every GPU and
for every job, and start each segment at its planned time, or later when
its GPUs, its job or its arrival are not ready yet; it lasts its epochs at the epoch time of the placement it
actually has (GPUs spread over nodes run slower where the profile says so)
plus the resize cost when it does not continue its job's previous segment
on the same GPUs at the same instant. Policies that ignore placement or
resize cost (the reference ones) are charged what they would really take;
a plan that already keeps every rule comes out unchanged.

`online(policy, problem)`: jobs arrive over time. At each arrival the
policy plans the jobs that have arrived so far (their remaining epochs,
none before the arrival), around the segments already under way. What it
starts before the next arrival is kept, up to the first epoch boundary at
or after that arrival (jobs checkpoint at epoch boundaries, and the
executor resizes running jobs there); the rest is replanned then. A policy
never sees a job before it arrives, and none is held to a choice it made
before the jobs that arrived since: it may keep a job on its GPUs (no
restart), resize it or stop it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from services.planner.core.engine import epochs_by, restart_cost
from services.planner.core.model import Plan, PlanningInput, Segment


def replay(plan: Plan, problem: PlanningInput, committed: Iterable[Segment] = (), not_before: float = 0.0) -> Plan:
    """The plan as the cluster runs it (see module docstring); same policy name."""
    gpu_free = [not_before] * problem.cluster.gpus
    last: dict[str, tuple[tuple[int, ...], float]] = {}
    for s in committed:
        for g in s.gpus:
            gpu_free[g] = max(gpu_free[g], s.end_s)
        if s.job not in last or s.end_s >= last[s.job][1]:
            last[s.job] = (tuple(s.gpus), s.end_s)
    out: list[Segment] = []
    for s in sorted(plan.segments, key=lambda s: (s.start_s, s.end_s, s.gpus)):
        job = problem.job(s.job)
        prev = last.get(s.job)
        start = max([s.start_s, not_before, job.arrival_s, prev[1] if prev else 0.0] + [gpu_free[g] for g in s.gpus])
        tau = job.epoch_seconds(len(s.gpus), problem.cluster.nodes_spanned(s.gpus))
        end = start + restart_cost(problem, prev, s.gpus, start) + s.epochs * tau
        for g in s.gpus:
            gpu_free[g] = end
        last[s.job] = (tuple(s.gpus), end)
        out.append(Segment(s.job, start, end, tuple(s.gpus), s.epochs))
    return Plan(plan.policy, tuple(out), None, plan.unplaced)


def online(policy: Callable[[PlanningInput], Plan], problem: PlanningInput, name: str | None = None) -> tuple[Plan, int]:
    """Replay arrivals, replanning at each; returns the plan run and the number of replans."""
    arrivals = sorted({j.arrival_s for j in problem.jobs})
    done = {j.id: 0 for j in problem.jobs}
    committed: list[Segment] = []
    replans = 0
    unplaced = ()
    for k, now in enumerate(arrivals):
        nxt = arrivals[k + 1] if k + 1 < len(arrivals) else float("inf")
        jobs = tuple(dataclasses.replace(j, epochs=j.epochs - done[j.id], arrival_s=now)
                     for j in problem.jobs if j.arrival_s <= now and done[j.id] < j.epochs)
        if not jobs:
            continue
        options = {**problem.options, "committed": tuple(committed), "start_s": now}
        sub = PlanningInput(jobs, problem.cluster, seed=problem.seed, options=options,
                            resize_cost_s=problem.resize_cost_s)
        plan = replay(policy(sub), sub, committed, not_before=now)
        replans += 1
        unplaced = plan.unplaced
        for s in plan.segments:
            if s.start_s < nxt:
                s = _until(s, nxt, sub)
                committed.append(s)
                done[s.job] += s.epochs
    return Plan(name or getattr(policy, "__name__", "policy"), tuple(committed), None, unplaced), replans


def _until(s: Segment, t: float, problem: PlanningInput) -> Segment:
    """Segment s up to its first epoch boundary at or after t (at least one epoch)."""
    if s.end_s <= t:
        return s
    tau = problem.job(s.job).epoch_seconds(len(s.gpus), problem.cluster.nodes_spanned(s.gpus))
    first = s.end_s - s.epochs * tau  # where its first epoch starts (after any restart)
    k = epochs_by(first, tau, s.epochs, t)
    return s if k >= s.epochs else dataclasses.replace(s, end_s=first + k * tau, epochs=k)
