"""The fluid relaxation, solved exactly without an LP solver.

For job j, running all E_j epochs on g GPUs takes D_j(g) = E_j t_j(g) seconds
and g D_j(g) GPU-seconds. In the fluid LP (see bounds.fluid) a job may split
its epochs over GPU counts, so the (time, area) pairs it can reach are the
convex combinations of its points; only the lower-left convex hull matters.
A_j(T) = least area job j needs to finish within T: convex, non-increasing,
piecewise linear over the hull. The LP optimum is the least T >= max_j
min_g D_j(g) with sum_j A_j(T) <= G T, found by bisection on T and then made
exact on the linear piece that holds it.

Cost: O(n G) to read the profiles and build the hulls, then O(n h) per
bisection step (h = hull points, a handful): 1,000 jobs on 1,024 GPUs take a
fraction of a second where the LP has a million columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.planner.core.model import PlanningInput


@dataclass(frozen=True)
class Hull:
    """Job j's efficient GPU counts: time strictly falling, area strictly rising."""

    counts: tuple[int, ...]
    times: tuple[float, ...]  # D_j(g), descending
    areas: tuple[float, ...]  # g D_j(g), ascending, convex in time

    def area_within(self, T: float) -> float:
        """A_j(T): least GPU-seconds to finish within T (inf if T < fastest time)."""
        if T >= self.times[0]:
            return self.areas[0]
        if T < self.times[-1]:
            return float("inf")
        return float(np.interp(T, self.times[::-1], self.areas[::-1]))

    def mix(self, T: float) -> tuple[tuple[int, float], ...]:
        """The fluid optimum's split at makespan T: (count, share of the epochs)."""
        if T >= self.times[0]:
            return ((self.counts[0], 1.0),)
        for i in range(1, len(self.times)):
            if T >= self.times[i]:
                t0, t1 = self.times[i - 1], self.times[i]
                w = (t0 - T) / (t0 - t1)  # share on the larger count
                return ((self.counts[i - 1], 1.0 - w), (self.counts[i], w))
        return ((self.counts[-1], 1.0),)


def durations(problem: PlanningInput) -> np.ndarray:
    """D[j, g-1] = E_j t_j(g) for g = 1..G (best placement). Above a job's largest profiled count
    its time there (`Job.table`): no faster and more GPU-seconds, such a count is on no hull and
    lowers no bound, as if the job could not take it."""
    G = problem.cluster.gpus
    D = np.empty((len(problem.jobs), G))
    for i, job in enumerate(problem.jobs):
        D[i] = np.fromiter(job.table(G), float, G) * job.epochs
    return D


def pareto(D_row: np.ndarray) -> list[int]:
    """GPU counts g (1-based) that no other count beats in both time D(g) and area g D(g),
    by ascending area (ties: the faster)."""
    area = D_row * np.arange(1, D_row.shape[0] + 1)
    order = np.lexsort((D_row, area))
    d = D_row[order]
    keep = d < np.concatenate(([np.inf], np.minimum.accumulate(d)[:-1]))
    return [int(i) + 1 for i in order[keep]]


def hull_of(D_row: np.ndarray) -> Hull:
    """The lower-left convex hull of the points (D(g), g D(g)), g = 1..G."""
    pts = [(float(D_row[g - 1]), float(g * D_row[g - 1]), g) for g in pareto(D_row)]
    # Convexity of area as a function of time (times descending along pts).
    hull: list[tuple[float, float, int]] = []
    for p in pts:
        while len(hull) >= 2:
            (t1, a1, _), (t2, a2, _) = hull[-2], hull[-1]
            # keep hull[-1] only if it lies below the chord hull[-2] -> p
            if (a2 - a1) * (t1 - p[0]) >= (p[1] - a1) * (t1 - t2) - 1e-12 * abs(a1 + p[1]):
                hull.pop()
            else:
                break
        hull.append(p)
    return Hull(tuple(p[2] for p in hull), tuple(p[0] for p in hull), tuple(p[1] for p in hull))


@dataclass(frozen=True)
class FluidSolution:
    T: float
    hulls: tuple[Hull, ...]


def solve(problem: PlanningInput, D: np.ndarray | None = None) -> FluidSolution:
    """The fluid LP's optimal makespan and every job's hull."""
    D = durations(problem) if D is None else D
    G = problem.cluster.gpus
    hulls = tuple(hull_of(row) for row in D)
    m = max(len(h.times) for h in hulls)
    n = len(hulls)
    # Padded arrays with ascending times for vectorised interpolation.
    Ht = np.full((n, m), np.inf)
    Ha = np.zeros((n, m))
    for j, h in enumerate(hulls):
        k = len(h.times)
        Ht[j, :k] = h.times[::-1]
        Ha[j, :k] = h.areas[::-1]
        Ha[j, k:] = h.areas[0]
    lo = float(Ht[:, 0].max())  # LB_length: every job at its fastest

    counts = np.array([len(h.times) for h in hulls])
    rows = np.arange(n)

    def total_area(T: float) -> float:
        """sum_j A_j(T), for T >= every job's fastest time."""
        i = (Ht <= T).sum(axis=1) - 1  # the hull point at or just below T
        full = i >= counts - 1  # T beyond the slowest (least-area) point
        t0, a0 = Ht[rows, i], Ha[rows, i]
        i1 = np.minimum(i + 1, counts - 1)
        t1, a1 = Ht[rows, i1], Ha[rows, i1]
        w = np.where(full, 0.0, (T - t0) / np.where(full, 1.0, t1 - t0))
        return float((a0 + w * (a1 - a0)).sum())

    if total_area(lo) <= G * lo:
        return FluidSolution(lo, hulls)
    hi = max(lo, float(sum(h.areas[0] for h in hulls)) / G)
    while total_area(hi) > G * hi:
        hi *= 2
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if total_area(mid) <= G * mid:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    return FluidSolution(hi, hulls)
