"""Node packing: every job on one node, the nodes planned one by one.

Used by the `omru` policy (policies/omru.py). In the fluid optimum of a
batch with more GPUs than jobs, every job runs all the time on few GPUs;
list scheduling over the whole cluster instead starts the first jobs of its
order on the counts that meet T and leaves the rest to start late and wide.
Here each job is given to a node first, the longest first (its time on the
fewest GPUs of one node that end it by T), each to the node with the fewest
GPU-seconds given where it can still end by T (its hull over 1..K GPUs
says how many it needs there), then each node's jobs are list-scheduled
on its K GPUs alone (by `schedule`, which the caller provides), then jobs
move or swap between the node that ends last and the others while that
ends the pair earlier. The nodes' plans side by side are a plan for the
cluster: a job on one node runs at its best placement, so the times planned
are the times it gets.

Wide jobs, the few (at most WIDE_JOBS) that cannot end by T on one node,
first run some epochs wide on whole nodes of their own, all at once from
the start (or their arrival), then the rest on one node like the others,
after a restart. Each runs the fewest epochs wide that let the rest end by
T on one node; the counts are those of least GPU-seconds (their nodes'
whole GPUs counted) among the choices whose nodes fit in the cluster
together (the WIDE_CHOICES best are tried). The nodes a wide part holds
take other jobs once it ends.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

from services.planner.core import fluid
from services.planner.core.model import Cluster, PlanningInput, Segment
from services.planner.core.packing import wide_epochs

#: Node plans (list schedules of one node's jobs) built at most per target and choice of wide parts.
EVALS = 600
#: Wide jobs handled at most, the counts each may run its wide part on (the least GPU-seconds
#: first), and the choices of counts for all of them tried per target.
WIDE_JOBS = 3
WIDE_COUNTS = 4
WIDE_CHOICES = 2

#: (one node's jobs, their hulls on it, target, when the node is free, {job: when its wide part
#: ends}) -> segments on GPUs 0..K-1, or None.
Schedule = Callable[[PlanningInput, tuple[fluid.Hull, ...], float, float, dict], tuple[Segment, ...] | None]


class NodePacker:
    """Node plans for one batch, remembered by their set of jobs, target and wide parts."""

    def __init__(self, problem: PlanningInput, D, schedule: Schedule) -> None:
        self.p = problem
        self.D = D
        self.K = problem.cluster.gpus_per_node
        self.N = problem.cluster.nodes
        self.one_node = tuple(fluid.hull_of(D[j, :self.K]) for j in range(len(problem.jobs)))
        self.schedule = schedule
        self._plans: dict[tuple, tuple[float, tuple[Segment, ...]]] = {}
        self.left = 0  # node plans the current packing may still build
        self._use(())

    def _use(self, wide: tuple[tuple[int, int, int], ...]) -> None:
        """Plan with wide parts `wide` ((job, count, epochs), ...) from time 0: the jobs that are
        left for the nodes, their hulls on one node, when each may start there (after its wide
        part), when each node is free, and the wide parts' segments."""
        self.wide = wide
        self.jobs = list(self.p.jobs)
        self.hulls = list(self.one_node)
        self.after = [0.0] * len(self.jobs)
        self.free = [0.0] * self.N
        self.wide_parts: list[Segment] = []  # on whole nodes from the first
        n0 = 0
        for j, c, x in wide:
            job = self.jobs[j]
            self.jobs[j] = dataclasses.replace(job, epochs=job.epochs - x)
            self.hulls[j] = fluid.hull_of(self.D[j, :self.K] * (job.epochs - x) / job.epochs)
            m = -(-c // self.K)
            self.after[j] = job.arrival_s + x * job.epoch_seconds(c, m)
            self.free[n0:n0 + m] = [self.after[j]] * m
            gpus = tuple(range(n0 * self.K, n0 * self.K + c))
            self.wide_parts.append(Segment(job.id, job.arrival_s, self.after[j], gpus, x))
            n0 += m

    def node(self, jobs: list[int], T: float, start: float = 0.0) -> tuple[float, tuple[Segment, ...]]:
        """(end, segments on GPUs 0..K-1) of the jobs `jobs` alone on one node free from `start`
        (end inf when `schedule` cannot place them)."""
        key = (tuple(sorted(jobs)), T, start, self.wide)
        if key not in self._plans:
            self.left -= 1
            if not jobs:
                self._plans[key] = (start, ())
            else:
                sub = PlanningInput(tuple(self.jobs[j] for j in key[0]), Cluster(1, self.K),
                                    resize_cost_s=self.p.resize_cost_s)
                after = {i: self.after[j] for i, j in enumerate(key[0]) if self.after[j]}
                segs = self.schedule(sub, tuple(self.hulls[j] for j in key[0]), T, start, after)
                self._plans[key] = (math.inf, ()) if segs is None else (max(s.end_s for s in segs), segs)
        return self._plans[key]

    def pack(self, T: float) -> list[Segment] | None:
        """Segments for target T, or None when some job cannot end by T on one node after its
        wide part (or some node's jobs cannot be placed)."""
        wide = [j for j, h in enumerate(self.one_node) if math.isinf(h.area_within(T))]
        if len(wide) > WIDE_JOBS:
            return None
        best = None
        for choice in self._choices(wide, T):  # () when no job is wide
            segments = self._pack(T, choice)
            if segments is not None and (best is None or max(s.end_s for s in segments) < max(s.end_s for s in best)):
                best = segments
        return best

    def _choices(self, wide: list[int], T: float) -> list[tuple[tuple[int, int, int], ...]]:
        """The WIDE_CHOICES choices of wide parts ((job, count, epochs), ...) of least GPU-seconds
        whose nodes fit in the cluster together."""
        K, R = self.K, self.p.resize_cost_s
        options = []
        for j in wide:
            E = self.p.jobs[j].epochs
            narrow = self.D[j, :K].min() / E  # an epoch at its fastest on one node
            mine = []
            for c in fluid.pareto(self.D[j]):
                m = -(-c // K)  # whole nodes
                tau = self.p.jobs[j].epoch_seconds(c, m) if K < c and m <= self.N else math.inf
                x = wide_epochs(E, narrow, tau, T - self.p.jobs[j].arrival_s, R) if tau < narrow else 0
                if x:
                    mine.append((x * tau * m * K + (E - x) * narrow * K, m, (j, c, x)))
            options.append(sorted(mine)[:WIDE_COUNTS])
        fits = sorted((sum(o[0] for o in combo), tuple(o[2] for o in combo))
                      for combo in itertools.product(*options) if sum(o[1] for o in combo) <= self.N)
        return [choice for _, choice in fits[:WIDE_CHOICES]]

    def _pack(self, T: float, wide: tuple[tuple[int, int, int], ...]) -> list[Segment] | None:
        self._use(wide)
        N, K = self.N, self.K
        nodes: list[list[int]] = [[] for _ in range(N)]
        load = [K * f for f in self.free]

        def need(j: int, n: int) -> float:  # GPU-seconds job j needs on node n to end by T
            return self.hulls[j].area_within(T - max(self.free[n], self.after[j]))

        def seconds(j: int) -> float:  # on the fewest GPUs of one node that end it by T
            h, W = self.hulls[j], T - self.after[j]
            return next((t for t in h.times if t <= W * (1 + 1e-12)), h.times[-1])

        for j in sorted(range(len(self.jobs)), key=lambda j: (-seconds(j), j)):
            fits = [n for n in range(N) if not math.isinf(need(j, n))]
            if not fits:
                return None
            n = min(fits, key=lambda n: (load[n], n))
            nodes[n].append(j)
            load[n] += need(j, n)
        self.left = EVALS
        ends = [self.node(nd, T, self.free[n])[0] for n, nd in enumerate(nodes)]
        while self.left > 0 and self._improve(nodes, ends, T):
            pass
        if math.isinf(max(ends)):
            return None
        out = list(self.wide_parts)
        for n, nd in enumerate(nodes):
            for s in self.node(nd, T, self.free[n])[1]:
                out.append(Segment(s.job, s.start_s, s.end_s, tuple(n * K + g for g in s.gpus), s.epochs))
        return out

    def _improve(self, nodes: list[list[int]], ends: list[float], T: float) -> bool:
        """Move one job of the node that ends last to another node, or swap it with one there,
        if that ends both earlier than it does now (the first such move, largest jobs first)."""
        w = max(range(len(nodes)), key=lambda n: (ends[n], -n))
        # A node's jobs need at least sum_j A_j(e - after_j) GPU-seconds between when it is
        # free and e: a move that leaves either node needing K (e - free) or more cannot end it
        # by e = ends[w].
        e = ends[w]
        area = [h.area_within(T - a) for h, a in zip(self.hulls, self.after)]
        need = [h.area_within(e - a) for h, a in zip(self.hulls, self.after)]
        load = [sum(need[x] for x in nd) for nd in nodes]
        room = [self.K * (e - f) * (1 - 1e-9) for f in self.free]
        for j in sorted(nodes[w], key=lambda j: (-area[j], j)):
            for m in sorted(range(len(nodes)), key=lambda n: (ends[n], n)):
                if m == w:
                    continue
                rest = [x for x in nodes[w] if x != j]
                for k in [None] + nodes[m]:
                    give = need[k] if k is not None else 0.0
                    if load[w] - need[j] + give >= room[w] or load[m] + need[j] - give >= room[m]:
                        continue
                    a = rest + ([k] if k is not None else [])
                    b = [x for x in nodes[m] if x != k] + [j]
                    if self.left <= 0:
                        return False
                    ea, eb = self.node(a, T, self.free[w])[0], self.node(b, T, self.free[m])[0]
                    if max(ea, eb) < ends[w] * (1 - 1e-9):
                        nodes[w], nodes[m], ends[w], ends[m] = a, b, ea, eb
                        return True
        return False
