"""Node packing: every job on one node, the nodes planned one by one.

Used by the `omru` policy (policies/omru.py) on batches where every job can
finish within the target makespan T on one node. In the fluid optimum of a
batch with more GPUs than jobs, every job runs all the time on few GPUs;
list scheduling over the whole cluster instead starts the first jobs of its
order on the counts that meet T and leaves the rest to start late and wide.
Here each job is given to a node first, by the GPU-seconds it needs on one
node to end by T (its hull over 1..K GPUs; the largest to the least loaded
node), then each node's jobs are list-scheduled on its K GPUs alone (by
`schedule`, which the caller provides), then jobs move or swap between the
node that ends last and the others while that ends the pair earlier. The
nodes' plans side by side are a plan for the cluster: a job on one node runs
at its best placement, so the times planned are the times it gets.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from services.planner.core import fluid
from services.planner.core.model import Cluster, PlanningInput, Segment

#: Node plans (list schedules of one node's jobs) built at most per target.
EVALS = 600

#: (one node's jobs, their hulls on it, target) -> segments on GPUs 0..K-1, or None.
Schedule = Callable[[PlanningInput, tuple[fluid.Hull, ...], float], tuple[Segment, ...] | None]


class NodePacker:
    """Node plans for one batch, remembered by their set of jobs and target."""

    def __init__(self, problem: PlanningInput, D, schedule: Schedule) -> None:
        self.p = problem
        self.K = problem.cluster.gpus_per_node
        self.hulls = tuple(fluid.hull_of(D[j, :self.K]) for j in range(len(problem.jobs)))
        self.schedule = schedule
        self._plans: dict[tuple[tuple[int, ...], float], tuple[float, tuple[Segment, ...]]] = {}
        self.left = 0  # node plans the current target may still build

    def node(self, jobs: list[int], T: float) -> tuple[float, tuple[Segment, ...]]:
        """(end, segments on GPUs 0..K-1) of the jobs `jobs` alone on one node (end inf when
        `schedule` cannot place them)."""
        key = (tuple(sorted(jobs)), T)
        if key not in self._plans:
            self.left -= 1
            if not jobs:
                self._plans[key] = (0.0, ())
            else:
                sub = PlanningInput(tuple(self.p.jobs[j] for j in key[0]), Cluster(1, self.K),
                                    resize_cost_s=self.p.resize_cost_s)
                segs = self.schedule(sub, tuple(self.hulls[j] for j in key[0]), T)
                self._plans[key] = (math.inf, ()) if segs is None else (max(s.end_s for s in segs), segs)
        return self._plans[key]

    def pack(self, T: float) -> list[Segment] | None:
        """Segments for target T, or None when some job cannot end by T on one node (or some
        node's jobs cannot be placed)."""
        area = [h.area_within(T) for h in self.hulls]
        if any(math.isinf(a) for a in area):
            return None
        N = self.p.cluster.nodes
        nodes: list[list[int]] = [[] for _ in range(N)]
        load = [0.0] * N
        for j in sorted(range(len(area)), key=lambda j: (-area[j], j)):
            n = min(range(N), key=lambda n: (load[n], n))
            nodes[n].append(j)
            load[n] += area[j]
        self.left = EVALS
        ends = [self.node(nd, T)[0] for nd in nodes]
        while self.left > 0 and self._improve(nodes, ends, area, T):
            pass
        if math.isinf(max(ends)):
            return None
        out = []
        for n, nd in enumerate(nodes):
            for s in self.node(nd, T)[1]:
                out.append(Segment(s.job, s.start_s, s.end_s, tuple(n * self.K + g for g in s.gpus), s.epochs))
        return out

    def _improve(self, nodes: list[list[int]], ends: list[float], area: list[float], T: float) -> bool:
        """Move one job of the node that ends last to another node, or swap it with one there,
        if that ends both earlier than it does now (the first such move, largest jobs first)."""
        w = max(range(len(nodes)), key=lambda n: (ends[n], -n))
        # A node's jobs need at least sum_j A_j(e) GPU-seconds to end by e: moves that
        # leave either node more than K e of them cannot end it by e = ends[w].
        e = ends[w]
        need = [h.area_within(e) for h in self.hulls]
        load = [sum(need[x] for x in nd) for nd in nodes]
        room = self.K * e * (1 - 1e-9)
        for j in sorted(nodes[w], key=lambda j: (-area[j], j)):
            for m in sorted(range(len(nodes)), key=lambda n: (ends[n], n)):
                if m == w:
                    continue
                rest = [x for x in nodes[w] if x != j]
                for k in [None] + nodes[m]:
                    give = need[k] if k is not None else 0.0
                    if load[w] - need[j] + give >= room or load[m] + need[j] - give >= room:
                        continue
                    a = rest + ([k] if k is not None else [])
                    b = [x for x in nodes[m] if x != k] + [j]
                    if self.left <= 0:
                        return False
                    ea, eb = self.node(a, T)[0], self.node(b, T)[0]
                    if max(ea, eb) < ends[w] * (1 - 1e-9):
                        nodes[w], nodes[m], ends[w], ends[m] = a, b, ea, eb
                        return True
        return False
