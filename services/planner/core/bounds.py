"""Lower bounds on the makespan, with D_j(g) = E_j * t_j(g), g in 1..G.

A job profiled up to fewer GPUs than G cannot run on more: above its largest
count D_j(g) is its time there (fluid.durations), never faster and more
GPU-seconds, so those counts lower none of the bounds below.

length: max_j min_g D_j(g)             (no job can finish faster)
area:   sum_j min_g g D_j(g) / G       (the work must fit on G GPUs)
fluid:  the LP where each job splits its work over GPU counts (valid when
        jobs may be resized at epoch boundaries); solved with HiGHS
static: for plans that never resize a job: the smallest T >= length with
        sum_j min{ g D_j(g) : D_j(g) <= T } <= G T
whole_epochs: the fluid LP with each job's epochs split over GPU counts in
        whole epochs, one restart paid per count after its first, and no job
        ending before its arrival plus its time (a MILP; not in all_bounds:
        it is for measuring how far a plan is from what whole epochs allow)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.planner.core import fluid as fluid_solution
from services.planner.core.model import PlanningError, PlanningInput


@dataclass(frozen=True)
class LowerBounds:
    length_s: float
    area_s: float
    fluid_s: float
    static_s: float

    def to_dict(self) -> dict:
        return {"length_s": self.length_s, "area_s": self.area_s, "fluid_s": self.fluid_s, "static_s": self.static_s}


def length(problem: PlanningInput) -> float:
    return float(fluid_solution.durations(problem).min(axis=1).max())


def area(problem: PlanningInput) -> float:
    D = fluid_solution.durations(problem)
    g = np.arange(1, D.shape[1] + 1)
    return float((D * g).min(axis=1).sum() / D.shape[1])


def fluid(problem: PlanningInput) -> float:
    """min T s.t. sum_g x_jg = 1, sum_g x_jg D_jg <= T, sum_jg x_jg g D_jg <= G T, x >= 0."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    D = fluid_solution.durations(problem)
    n, G = D.shape
    nv = n * G + 1  # x_jg row-major, then T
    c = np.zeros(nv)
    c[-1] = 1.0
    rows, cols, vals = [], [], []
    for j in range(n):  # per-job time: sum_g x_jg D_jg - T <= 0
        rows += [j] * G + [j]
        cols += list(range(j * G, (j + 1) * G)) + [nv - 1]
        vals += list(D[j]) + [-1.0]
    gD = (D * np.arange(1, G + 1)).ravel()
    rows += [n] * (n * G) + [n]
    cols += list(range(n * G)) + [nv - 1]
    vals += list(gD) + [-float(G)]
    A_ub = coo_matrix((vals, (rows, cols)), shape=(n + 1, nv)).tocsr()
    A_eq = coo_matrix(
        (np.ones(n * G), (np.repeat(np.arange(n), G), np.arange(n * G))), shape=(n, nv)
    ).tocsr()
    res = linprog(c, A_ub=A_ub, b_ub=np.zeros(n + 1), A_eq=A_eq, b_eq=np.ones(n), bounds=(0, None), method="highs")
    if res.status != 0:
        raise PlanningError(f"fluid lower bound: LP solver failed ({res.message})")
    return float(res.x[-1])


def static(problem: PlanningInput) -> float:
    D = fluid_solution.durations(problem)
    n, G = D.shape
    area_of = D * np.arange(1, G + 1)
    lo = length(problem)
    # f(T) = sum_j min{g D_jg : D_jg <= T} only changes at the D values.
    points = sorted({float(d) for d in D.ravel() if d >= lo} | {lo})
    for i, b in enumerate(points):
        F = float(np.where(D <= b * (1 + 1e-12), area_of, np.inf).min(axis=1).sum())
        T = max(b, F / G)
        if i + 1 == len(points) or T < points[i + 1]:
            return T
    raise AssertionError("unreachable")  # the last interval is unbounded


def whole_epochs(problem: PlanningInput, time_limit_s: float = 60.0) -> float:
    """The whole-epoch bound (module docstring), solved with HiGHS; past the time limit, the
    solver's proven lower bound. Only each job's Pareto counts (no count both slower and
    dearer in GPU-seconds than another) are variables: the others never lower the bound."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    D = fluid_solution.durations(problem)
    n, G = D.shape
    R = problem.resize_cost_s
    var = [(j, g) for j in range(n) for g in fluid_solution.pareto(D[j])]  # (job, GPU count)
    m = len(var)
    # Variables: epochs x_k, then "count used" y_k (binary), then T.
    rows, cols, vals, lo, hi = [], [], [], [], []
    for k, (j, g) in enumerate(var):
        E = problem.jobs[j].epochs
        tau = D[j, g - 1] / E
        rows += [j, n + j, n + j, 2 * n + k, 2 * n + k, 2 * n + m]
        cols += [k, k, m + k, k, m + k, k]
        vals += [1.0, tau, R, 1.0, -float(E), g * tau]
    for j, job in enumerate(problem.jobs):  # sum_k x = E_j; time + R (counts - 1) + arrival <= T
        rows.append(n + j)
        cols.append(2 * m)
        vals.append(-1.0)
    lo += [float(job.epochs) for job in problem.jobs] + [-np.inf] * (n + m + 1)
    hi += [float(job.epochs) for job in problem.jobs] + [R - job.arrival_s for job in problem.jobs] + [0.0] * m
    rows.append(2 * n + m)  # area: sum x g tau <= G T
    cols.append(2 * m)
    vals.append(-float(G))
    hi.append(0.0)
    A = coo_matrix((vals, (rows, cols)), shape=(2 * n + m + 1, 2 * m + 1)).tocsr()
    c = np.zeros(2 * m + 1)
    c[-1] = 1.0
    upper = np.array([problem.jobs[j].epochs for j, _ in var] + [1] * m + [np.inf], dtype=float)
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=np.r_[np.ones(2 * m), 0],
               bounds=Bounds(np.zeros(2 * m + 1), upper), options={"time_limit": time_limit_s})
    bound = getattr(res, "mip_dual_bound", None)
    if bound is None or not np.isfinite(bound):
        raise PlanningError(f"whole-epoch lower bound: MILP solver failed ({res.message})")
    return float(max(bound, fluid_solution.solve(problem, D).T))


def all_bounds(problem: PlanningInput) -> LowerBounds:
    return LowerBounds(length(problem), area(problem), fluid(problem), static(problem))
