"""`omru`: fluid-guided list scheduling with resizes where they pay.

1. Solve the fluid relaxation exactly (core/fluid.py): its makespan T* is the
   fluid lower bound, and each job's convex hull of (time, GPU-seconds) says
   which GPU counts are efficient.
2. For a target makespan T, each job's count is the fewest GPUs on its hull
   that finish it within T (the least GPU-seconds that meet T). Jobs start
   longest first on the cluster as GPUs come free (backfilling smaller ones),
   on as few nodes as possible, charged the time of the placement chosen.
3. Once nothing waits, GPUs that come free go to running jobs, most critical
   (latest end) first: a job grows at its next epoch boundary only when that
   ends it earlier even after the resize cost, so late in the batch the
   stragglers take the cluster (the wrap-around the fluid optimum does with
   fractions, done with whole epochs and few resizes).
4. Steps 2-3 are tried for a handful of targets T around T* (every hull
   breakpoint on small instances) and both "wait for the full count" and
   "start on what is free"; the plan with the least makespan wins (then fewer
   resizes). Each try is one event-driven pass, O(events x running jobs), so
   1,000 jobs on 1,024 GPUs plan in about a second.

Every plan comes from the engine (core/engine.py), so GPU ids, epoch
boundaries, placement times, resize costs and arrivals are true by
construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.planner.core import fluid
from services.planner.core.engine import EPS, Engine, resizes
from services.planner.core.model import Plan, PlanningError, PlanningInput
from services.planner.core.registry import register

#: Target makespans tried, as multiples of T* (plus hull breakpoints when few).
FACTORS = (1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.6, 2.0, 3.0)
#: Below this many hull breakpoints near T*, every one of them is tried.
EXHAUSTIVE_BREAKPOINTS = 120
#: A resize must shorten the job's remaining time by at least this share.
MIN_GAIN = 0.01
#: Batches with more jobs x GPUs than this try only BIG_FACTORS and no local search.
BIG = 50_000
BIG_FACTORS = (1.0, 1.1, 1.3)
#: Engine passes the local search may spend, divided by the number of jobs.
LOCAL_SEARCH_RUNS = 4000
#: (start on what is free, grow only to hull counts) variants tried per target.
MODES = ((False, False), (True, False), (False, True), (True, True))


@dataclass
class _Omru:
    targets: list[int]
    order: list[int]
    hulls: tuple[fluid.Hull, ...]
    fit: bool
    hull_only: bool = False
    quantum_s: float | None = None

    def step(self, e: Engine) -> None:
        waiting = set(e.waiting())
        if waiting and e.free_count:
            self.order = [j for j in self.order if e.remaining[j] > 0 or j in e.running]
        for j in self.order if waiting else ():
            if e.free_count == 0:
                break
            if j not in waiting:
                continue
            g = self.targets[j]
            if g <= e.free_count:
                e.start(j, g)
            elif self.fit and 2 * e.free_count >= g:
                e.start(j, e.free_count)
        if e.free_count and not (waiting and e.waiting()):
            self._grow(e)

    def _grow(self, e: Engine) -> None:
        done: set[int] = set()
        while e.free_count:
            live = [(r.end, j) for j, r in e.running.items() if j not in done and r.start <= e.now + EPS]
            if not live:
                return
            end, j = max(live)
            done.add(j)
            g = len(e.running[j].gpus)
            options = [c for c in self.hulls[j].counts if g < c <= g + e.free_count]
            if not self.hull_only:
                options.append(g + e.free_count)
            best, best_end = None, end - MIN_GAIN * (end - e.now)
            for c in options:
                t = e.projected_end(j, c)
                if t < best_end:
                    best, best_end = c, t
            if best is not None:
                e.resize(j, best)


def _target(h: fluid.Hull, T: float) -> int:
    """Fewest GPUs on the hull that finish within T (the fastest count if none do)."""
    for c, t in zip(h.counts, h.times):
        if t <= T * (1 + 1e-12):
            return c
    return h.counts[-1]


def _makespans(sol: fluid.FluidSolution) -> list[float]:
    T = sol.T
    out = {T * f for f in FACTORS}
    near = sorted({t for h in sol.hulls for t in h.times if T <= t <= 2 * T})
    if len(near) <= EXHAUSTIVE_BREAKPOINTS:
        out |= set(near)
    return sorted(out)


def plan_with(problem: PlanningInput, start_s: float = 0.0, committed=()) -> Plan:
    """The `omru` plan, optionally continuing from `committed` segments at `start_s`."""
    sol = fluid.solve(problem)
    n = len(problem.jobs)
    tried: dict[tuple, tuple[tuple[float, int], Plan]] = {}

    def lpt(targets: tuple[int, ...]) -> tuple[int, ...]:
        dur = [problem.jobs[j].duration(targets[j]) for j in range(n)]
        return tuple(sorted(range(n), key=lambda j: (-dur[j], problem.jobs[j].arrival_s, j)))

    def attempt(targets: tuple[int, ...], order: tuple[int, ...], mode: tuple[bool, bool]) -> tuple[float, int]:
        key = (targets, order, mode)
        if key not in tried:
            plan = Engine(problem, _Omru(list(targets), list(order), sol.hulls, *mode), start_s=start_s,
                          committed=committed).run("omru")
            score = (plan.makespan_s if not plan.unplaced else float("inf"), resizes(plan))
            tried[key] = (score, plan)
        return tried[key][0]

    big = n * problem.cluster.gpus > BIG
    for T in _makespans(sol) if not big else [sol.T * f for f in BIG_FACTORS]:
        targets = tuple(_target(h, T) for h in sol.hulls)
        for mode in MODES if not big else MODES[:2]:
            attempt(targets, lpt(targets), mode)
    # Local search on small batches: one job's count, or two jobs' places in the order.
    budget = 0 if big else LOCAL_SEARCH_RUNS // max(1, n)
    (targets, order, mode), (score, _) = min(tried.items(), key=lambda kv: kv[1][0])
    improved = True
    while improved and budget > 0:
        improved = False
        moves = [(targets[:j] + (c,) + targets[j + 1:], order)
                 for j in range(n) for c in sol.hulls[j].counts if c != targets[j]]
        moves += [(targets, order[:i] + (order[k],) + order[i + 1:k] + (order[i],) + order[k + 1:])
                  for i in range(n) for k in range(i + 1, n)]
        for cand_targets, cand_order in moves:
            if budget <= 0:
                break
            budget -= 1
            s = attempt(cand_targets, cand_order, mode)
            if s < score:
                score, targets, order, improved = s, cand_targets, cand_order, True
                break
    return min(tried.values(), key=lambda v: v[0])[1]


@register("omru")
def omru(problem: PlanningInput) -> Plan:
    """Fluid-guided list scheduling with profitable resizes (see module docstring)."""
    committed = problem.options.get("committed", ())
    start_s = problem.options.get("start_s", 0.0)
    if not isinstance(start_s, (int, float)) or start_s < 0:
        raise PlanningError(f"omru: start_s must be a time >= 0, got {start_s!r}")
    return plan_with(problem, float(start_s), committed)
