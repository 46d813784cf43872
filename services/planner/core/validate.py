"""The one place that checks a plan against its input.

Rules: every segment names a known job, holds distinct GPU ids of the
cluster, no more of them than its job's largest profiled count (`max_gpus`),
and at least one epoch; no segment starts before 0 or before its
job's arrival; no GPU is in two overlapping segments; the segments of one job
never overlap; each job gets exactly its epochs (none, if the plan lists it as
unplaced); every segment lasts at least epochs * t_job(len(gpus), nodes
spanned) (the placement-dependent time where the job has one), plus the
input's resize cost when it does not continue its job's previous segment on
the same GPUs at the same instant (a checkpoint and a restart).
"""

from __future__ import annotations

from collections import defaultdict

from services.planner.core.engine import restart_cost
from services.planner.core.model import Plan, PlanningInput

# Relative slack for float comparisons of times (sums of products of floats).
EPS = 1e-9


class InvalidPlan(AssertionError):
    """A plan that breaks a rule; `violations` lists every broken rule."""

    def __init__(self, violations: list[str]):
        super().__init__("; ".join(violations[:10]) + (f" (+{len(violations) - 10} more)" if len(violations) > 10 else ""))
        self.violations = violations


def violations(plan: Plan, problem: PlanningInput) -> list[str]:
    out: list[str] = []
    jobs = {j.id: j for j in problem.jobs}
    G = problem.cluster.gpus
    scale = max([1.0] + [abs(s.end_s) for s in plan.segments])
    tol = EPS * scale
    by_gpu: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    by_job: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    epochs: dict[str, int] = defaultdict(int)
    for i, s in enumerate(plan.segments):
        name = f"segment {i} ({s.job})"
        job = jobs.get(s.job)
        if job is None:
            out.append(f"{name}: unknown job")
            continue
        if not s.gpus:
            out.append(f"{name}: no GPUs")
            continue
        if len(set(s.gpus)) != len(s.gpus):
            out.append(f"{name}: GPU listed twice in {list(s.gpus)}")
        bad = [g for g in s.gpus if not (0 <= g < G)]
        if bad:
            out.append(f"{name}: GPU ids {bad} outside 0..{G - 1}")
        if s.epochs <= 0:
            out.append(f"{name}: {s.epochs} epochs")
        if len(s.gpus) > job.max_gpus:
            out.append(f"{name}: {len(s.gpus)} GPUs, more than job {job.id}'s largest profiled count "
                       f"({job.max_gpus})")
        else:
            nodes = problem.cluster.nodes_spanned(s.gpus)
            need = s.epochs * job.epoch_seconds(len(s.gpus), nodes)
            if s.end_s - s.start_s < need - tol:
                out.append(
                    f"{name}: lasts {s.end_s - s.start_s:.6g} s, {s.epochs} epochs on {len(s.gpus)} GPUs "
                    f"({nodes} nodes) need {need:.6g} s"
                )
        if s.start_s < max(0.0, job.arrival_s) - tol:
            out.append(f"{name}: starts at {s.start_s}, before 0 or the job's arrival at {job.arrival_s}")
        epochs[s.job] += s.epochs
        by_job[s.job].append((s.start_s, s.end_s, name))
        for g in set(s.gpus):
            by_gpu[g].append((s.start_s, s.end_s, name))
    for g, spans in by_gpu.items():
        out += [f"GPU {g}: {a} and {b} overlap" for a, b in _overlaps(spans, tol)]
    for job_id, spans in by_job.items():
        out += [f"job {job_id}: {a} and {b} overlap" for a, b in _overlaps(spans, tol)]
    if problem.resize_cost_s > 0:
        out += _unpaid_restarts(plan, problem, tol)
    unplaced = {u.job for u in plan.unplaced}
    for job in problem.jobs:
        want = 0 if job.id in unplaced else job.epochs
        if epochs[job.id] != want:
            out.append(f"job {job.id}: {epochs[job.id]} epochs planned, needs {want}"
                       + (" (listed as unplaced)" if want == 0 else ""))
    return out


def _unpaid_restarts(plan: Plan, problem: PlanningInput, tol: float) -> list[str]:
    out: list[str] = []
    by_job: dict[str, list[tuple[int, object]]] = defaultdict(list)
    for i, s in enumerate(plan.segments):
        by_job[s.job].append((i, s))
    jobs = {j.id: j for j in problem.jobs}
    for job_id, segs in by_job.items():
        job = jobs.get(job_id)
        if job is None:
            continue
        segs.sort(key=lambda p: p[1].start_s)
        prev = None
        for i, s in segs:
            cost = restart_cost(problem, prev, s.gpus, s.start_s)
            if cost and len(s.gpus) <= job.max_gpus:
                need = s.epochs * job.epoch_seconds(len(s.gpus), problem.cluster.nodes_spanned(s.gpus)) + cost
                if s.end_s - s.start_s < need - tol:
                    out.append(f"segment {i} ({job_id}): lasts {s.end_s - s.start_s:.6g} s, restarts on new GPUs "
                               f"or after a pause and needs {need:.6g} s with the {cost:g} s resize cost")
            prev = (s.gpus, s.end_s)
    return out


def check(plan: Plan, problem: PlanningInput) -> Plan:
    """Return `plan` if it keeps every rule, else raise InvalidPlan."""
    found = violations(plan, problem)
    if found:
        raise InvalidPlan(found)
    return plan


def _overlaps(spans: list[tuple[float, float, str]], tol: float):
    spans = sorted(spans)
    end, owner = -float("inf"), ""
    for start, stop, name in spans:
        if start < end - tol:
            yield owner, name
        if stop > end:
            end, owner = stop, name
