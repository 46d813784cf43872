"""Cluster-scheduler baselines, on the same engine as `omru`.

Rigid ones keep each job's `requested_gpus` (1 GPU where the job names none;
at most the cluster's GPUs and the job's largest profiled count):

- `fifo`: arrival order, strict (the head of the queue blocks the rest).
- `sjf`: shortest job (on its requested GPUs) first, smaller ones backfill.
  Neither preempts: online, a job under way goes on first at every replan.
- `tiresias`: Tiresias-style discretised least-attained-service: jobs sit in
  queues by attained GPU-seconds (thresholds grow x10 from `las_threshold_s`,
  default one tenth of the mean job's GPU-seconds); higher queues first,
  arrival order inside a queue; re-decided every `quantum_s` (default a
  twentieth of the mean job duration) and at every event; jobs that lose
  their GPUs are preempted at an epoch boundary and pay the restart.
- `min-total-duration`: Gavel's policy: the LP over time shares x_j (job j
  runs a share x_j of the time on its requested GPUs) with the least
  makespan T such that x_j T covers each job's work and sum_j x_j g_j <= G,
  found by binary search on T; realised in rounds (`quantum_s`) by giving
  GPUs to the jobs furthest behind their share, as Gavel's round scheduler
  does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from services.planner.core.engine import Engine
from services.planner.core.model import Plan, PlanningError, PlanningInput
from services.planner.core.registry import register


def requested(problem: PlanningInput) -> list[int]:
    """Each job's rigid GPU count: requested_gpus (capped at the cluster and its max_gpus), else 1."""
    G = problem.cluster.gpus
    return [min(j.requested_gpus or 1, G, j.max_gpus) for j in problem.jobs]


def _option(problem: PlanningInput, name: str, default: float) -> float:
    value = problem.options.get(name, default)
    if not (isinstance(value, (int, float)) and value > 0):
        raise PlanningError(f"option {name} must be a positive number of seconds, got {value!r}")
    return float(value)


def _run(problem: PlanningInput, policy, name: str) -> Plan:
    committed = problem.options.get("committed", ())
    start_s = float(problem.options.get("start_s", 0.0))
    return Engine(problem, policy, start_s=start_s, committed=committed).run(name)


def _under_way(problem: PlanningInput) -> set[str]:
    """Jobs with committed segments (online: started before this replan): the queues run them
    first, so they go on where they stopped and are never preempted."""
    return {s.job for s in problem.options.get("committed", ())}


@dataclass
class _Queue:
    """Start waiting jobs in `key` order on their rigid counts; `strict` stops at the first misfit."""

    counts: list[int]
    key: list[tuple]
    strict: bool
    quantum_s: float | None = None

    def step(self, e: Engine) -> None:
        for j in sorted(e.waiting(), key=lambda j: self.key[j]):
            if self.counts[j] <= e.free_count:
                e.start(j, self.counts[j])
            elif self.strict:
                return


@register("fifo")
def fifo(problem: PlanningInput) -> Plan:
    """First in, first out on the requested GPU counts; the head blocks."""
    started = _under_way(problem)
    key = [(j.id not in started, j.arrival_s, i) for i, j in enumerate(problem.jobs)]
    return _run(problem, _Queue(requested(problem), key, strict=True), "fifo")


@register("sjf")
def sjf(problem: PlanningInput) -> Plan:
    """Shortest job first on the requested GPU counts, with backfilling."""
    counts = requested(problem)
    started = _under_way(problem)
    key = [(j.id not in started, j.duration(counts[i]), j.arrival_s, i) for i, j in enumerate(problem.jobs)]
    return _run(problem, _Queue(counts, key, strict=False), "sjf")


@dataclass
class _Shares:
    """Each decision: rank the jobs, give GPUs in rank order, preempt who falls out."""

    counts: list[int]
    rank: object  # (engine, job) -> sortable
    quantum_s: float | None
    sticky: float = 0.0

    def step(self, e: Engine) -> None:
        live = [j for j in range(len(e.jobs))
                if j in e.running or (e.remaining[j] > 0 and e.not_before[j] <= e.now + 1e-9)]
        chosen: set[int] = set()
        room = e.G
        for j in sorted(live, key=lambda j: self.rank(e, j)):
            if self.counts[j] <= room:
                chosen.add(j)
                room -= self.counts[j]
        for j in list(e.running):
            if j not in chosen and e.running[j].start <= e.now:
                e.preempt(j)
        for j in sorted(chosen, key=lambda j: self.rank(e, j)):
            if j not in e.running:
                e.start(j, self.counts[j])


@register("tiresias", options=("las_threshold_s", "quantum_s"))
def tiresias(problem: PlanningInput) -> Plan:
    """Discretised least-attained-service on the requested GPU counts, preemptive."""
    counts = requested(problem)
    gpu_s = [j.duration(counts[i]) * counts[i] for i, j in enumerate(problem.jobs)]
    mean_d = float(np.mean([j.duration(counts[i]) for i, j in enumerate(problem.jobs)]))
    threshold = _option(problem, "las_threshold_s", float(np.mean(gpu_s)) / 10)
    quantum = _option(problem, "quantum_s", mean_d / 20)
    arrival = [j.arrival_s for j in problem.jobs]

    def rank(e: Engine, j: int):
        a = e.attained(j)
        queue = 0 if a < threshold else int(np.log10(a / threshold)) + 1
        return (queue, arrival[j], j)

    return _run(problem, _Shares(counts, rank, quantum), "tiresias")


def time_shares(problem: PlanningInput, counts: list[int]) -> tuple[float, list[float]]:
    """Gavel's min-total-duration LP: least T (binary search) with a feasible share vector."""
    from scipy.optimize import linprog

    G = problem.cluster.gpus
    D = np.array([j.duration(counts[i]) for i, j in enumerate(problem.jobs)])
    g = np.array(counts, dtype=float)
    n = len(D)

    def feasible(T: float):
        # x_j in [D_j / T, 1], sum_j g_j x_j <= G: minimise the GPUs used.
        lo = D / T
        if np.any(lo > 1 + 1e-12):
            return None
        res = linprog(g, A_ub=g[None, :], b_ub=[G], bounds=list(zip(lo, np.ones(n))), method="highs")
        return res.x if res.status == 0 else None

    lo, hi = float(D.max()), float(max(D.max(), (g * D).sum() / G)) * 2
    x = feasible(hi)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        m = feasible(mid)
        if m is not None:
            hi, x = mid, m
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    return hi, [float(v) for v in x]


@register("min-total-duration", options=("quantum_s",))
def min_total_duration(problem: PlanningInput) -> Plan:
    """Gavel-style: LP time shares on the requested GPU counts, realised in rounds."""
    counts = requested(problem)
    _, shares = time_shares(problem, counts)
    mean_d = float(np.mean([j.duration(counts[i]) for i, j in enumerate(problem.jobs)]))
    quantum = _option(problem, "quantum_s", mean_d / 20)
    arrival = [j.arrival_s for j in problem.jobs]

    def rank(e: Engine, j: int):
        elapsed = max(e.now - max(arrival[j], 0.0), 1e-9)
        behind = e.time_received(j) / elapsed / max(shares[j], 1e-12)  # < 1: behind its share
        return (behind, -shares[j], j)

    return _run(problem, _Shares(counts, rank, quantum), "min-total-duration")
