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

Greedy assignment sees GPU-seconds, not whether a node's jobs fit in time
(two one-epoch jobs that each need a whole node for 0.6 T cannot share one);
column generation (`pack(T, columns=True)`) sees both. Jobs alike on one
node form a type; a pattern is a set of jobs of each type that one node ends
by T (its list schedule says so). An LP over the patterns found covers every
job with the fewest nodes; its duals price new patterns (greedy fills by
value per GPU-second, one- and two-job changes to the patterns in use), the
best checked first, until no check finds one; then an integer program over
the patterns gives each node its pattern, or the target is missed.

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

import numpy as np
from scipy.optimize import LinearConstraint, linprog, milp

from services.planner.core import fluid
from services.planner.core.model import Cluster, PlanningInput, Segment
from services.planner.core.packing import Menu, plans, wide_epochs

#: Node plans (list schedules of one node's jobs) built at most per target and choice of wide parts.
EVALS = 600
#: Wide jobs handled at most, the counts each may run its wide part on (the least GPU-seconds
#: first), and the choices of counts for all of them tried per target.
WIDE_JOBS = 3
WIDE_COUNTS = 4
WIDE_CHOICES = 2
#: Column generation (NodePacker._columns): node plans built at most per target and choice of
#: wide parts, patterns checked at most per pricing round (the best reduced costs), greedy
#: fills per node class, types tried as the second job of a change, and branch-and-bound nodes
#: the integer program may explore.
COLUMN_EVALS = 2000
COLUMN_CHECKS = 40
FILL_STARTS = 12
CHANGE_TYPES = 20
MILP_NODES = 2000

#: (one node's jobs, their hulls on it, target, when the node is free, {job: when its wide part
#: ends}, None or a time: the first plan found that ends by it will do, and a quicker search
#: may miss plans that do) -> segments on GPUs 0..K-1, or None.
Schedule = Callable[[PlanningInput, tuple[fluid.Hull, ...], float, float, dict, float | None],
                    tuple[Segment, ...] | None]


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
            gpus = tuple(range(n0 * self.K, n0 * self.K + c))
            self.after[j] = job.arrival_s + x * job.epoch_seconds(c, self.p.cluster.nodes_spanned(gpus))
            self.free[n0:n0 + m] = [self.after[j]] * m
            self.wide_parts.append(Segment(job.id, job.arrival_s, self.after[j], gpus, x))
            n0 += m

    def node(self, jobs: list[int], T: float, start: float = 0.0,
             by: float | None = None) -> tuple[float, tuple[Segment, ...]]:
        """(end, segments on GPUs 0..K-1) of the jobs `jobs` alone on one node free from `start`
        (end inf when `schedule` cannot place them); with `by`, the first plan found that ends
        by then, if any."""
        best = (tuple(sorted(jobs)), T, start, self.wide, None)
        if best in self._plans:  # the best plan answers for any `by`
            return self._plans[best]
        key = best[:-1] + (by,)
        if key not in self._plans:
            self.left -= 1
            if not jobs:
                self._plans[key] = (start, ())
            else:
                sub = PlanningInput(tuple(self.jobs[j] for j in key[0]), Cluster(1, self.K),
                                    resize_cost_s=self.p.resize_cost_s)
                after = {i: self.after[j] for i, j in enumerate(key[0]) if self.after[j]}
                segs = self.schedule(sub, tuple(self.hulls[j] for j in key[0]), T, start, after, by)
                self._plans[key] = (math.inf, ()) if segs is None else (max(s.end_s for s in segs), segs)
        return self._plans[key]

    def pack(self, T: float, columns: bool = False) -> list[Segment] | None:
        """Segments for target T, or None when some job cannot end by T on one node after its
        wide part (or some node's jobs cannot be placed). The jobs go to nodes greedily, then
        move between them; with `columns`, by column generation instead (`_columns`), which
        returns only packings that end by T."""
        wide = [j for j, h in enumerate(self.one_node) if math.isinf(h.area_within(T))]
        if len(wide) > WIDE_JOBS:
            return None
        build = self._columns if columns else self._pack
        best = None
        for choice in self._choices(wide, T):  # () when no job is wide
            segments = build(T, choice)
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
                tau = (self.p.jobs[j].epoch_seconds(c, self.p.cluster.fewest_hosts(m)) if K < c and m <= self.N
                       else math.inf)
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
        return self._segments(nodes, T)

    def _segments(self, nodes: list[list[int]], T: float) -> list[Segment] | None:
        """The wide parts and node n's plan of its jobs nodes[n] on its GPUs (`node`), for every
        node, after moves between nodes (`_improve`, EVALS node plans at most); None if some
        node's jobs cannot be placed."""
        self.left = EVALS
        ends = [self.node(nd, T, self.free[n])[0] for n, nd in enumerate(nodes)]
        while self.left > 0 and self._improve(nodes, ends, T):
            pass
        out = list(self.wide_parts)
        for n, nd in enumerate(nodes):
            end, segments = self.node(nd, T, self.free[n])
            if math.isinf(end):
                return None
            out += [Segment(s.job, s.start_s, s.end_s, tuple(n * self.K + g for g in s.gpus), s.epochs)
                    for s in segments]
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

    # ------------------------------------------------------------ column generation

    def _columns(self, T: float, wide: tuple[tuple[int, int, int], ...]) -> list[Segment] | None:
        """Jobs to nodes as node patterns (Gilmore-Gomory): a pattern is a node class (nodes free
        at the same time) and how many jobs of each type (jobs alike on one node) one node of
        it runs, kept when the node's plan of them ends by T. The LP over the patterns found
        (cover every job, no class holding more nodes than it has, fewest nodes of the first)
        prices new patterns: greedy fills by dual value per GPU-second, and one- or two-job
        changes to the patterns it uses, the best reduced costs checked first. When no check
        finds one, an integer program picks whole patterns; None unless they fit the cluster."""
        self._use(wide)
        K = self.K
        frees = sorted(set(self.free))  # node classes; the first takes any overflow
        nodes_of = [[n for n in range(self.N) if self.free[n] == f] for f in frees]
        groups: dict[tuple, list[int]] = {}
        for j, job in enumerate(self.jobs):
            groups.setdefault((job.epochs, job.arrival_s, self.after[j], self.D[j, :K].tobytes()), []).append(j)
        types = list(groups.values())
        count = np.array([len(g) for g in types], dtype=float)
        # GPU-seconds a job of each type needs on a node of each class (whole epochs).
        area = np.array([[self._area(g[0], T - max(f, self.after[g[0]])) for g in types] for f in frees])
        area[np.isinf(area)] = 1e300  # none: more than any room, and 0 of it still counts 0
        room = [K * (T - f) * (1 + 1e-9) for f in frees]
        self.left = COLUMN_EVALS

        by = T * (1 + 1e-9)  # a node plan that ends by T will do

        def fits(c: int, a: tuple[int, ...]) -> bool:
            jobs = [j for t, k in enumerate(a) for j in types[t][:k]]
            return self.node(jobs, T, frees[c], by)[0] <= by

        cols = [(c, tuple(row)) for t, row in enumerate(np.eye(len(types), dtype=int).tolist())
                for c in range(len(frees)) if area[c, t] <= room[c] and fits(c, tuple(row))]
        if len({t for _, a in cols for t in np.flatnonzero(a)}) < len(types):
            return None  # some type fits no node
        held = np.array([len(nodes_of[k]) for k in range(1, len(frees))], dtype=float)

        def program() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """Objective (nodes of the first class), cover matrix (type x pattern), class rows."""
            cost = np.array([float(c == 0) for c, _ in cols])
            cover = np.array([a for _, a in cols], dtype=float).T
            classes = np.array([[float(c == k) for c, _ in cols] for k in range(1, len(frees))]).reshape(-1, len(cols))
            return cost, cover, classes

        seen = set(cols)
        while self.left > 0:
            cost, cover, classes = program()
            lp = linprog(cost, A_ub=np.vstack((-cover, classes)), b_ub=np.concatenate((-count, held)),
                         bounds=(0, None), method="highs")
            if lp.status != 0:
                return None
            y = -lp.ineqlin.marginals[:len(types)]  # what a job of each type is worth, in nodes
            z = np.concatenate(([0.0], lp.ineqlin.marginals[len(types):]))  # a node of each class, <= 0
            new = set()
            for c in range(len(frees)):
                new |= self._fills(y, area[c], count, room[c], c)
            for k in np.flatnonzero(lp.x > 1e-9):
                new |= self._changes(*cols[k], y, count)
            new = list(new - seen)
            if not new:
                break
            C, A = np.array([c for c, _ in new]), np.array([a for _, a in new], dtype=float)
            rc = (C == 0) - z[C] - A @ y  # reduced costs
            roomy = np.flatnonzero((area[C] * A).sum(axis=1) <= np.array(room)[C])
            priced = sorted((rc[i], new[i]) for i in roomy)
            found = 0
            for reduced, col in priced:
                if reduced > -1e-6 or self.left <= 0 or found >= COLUMN_CHECKS:
                    break
                seen.add(col)
                if fits(*col):
                    cols.append(col)
                    found += 1
            if not found:
                break
        cost, cover, classes = program()
        rules = [LinearConstraint(cover, count, np.inf)] + ([LinearConstraint(classes, 0, held)] if len(held) else [])
        ip = milp(cost, integrality=np.ones(len(cols)), constraints=rules, options={"node_limit": MILP_NODES})
        if ip.x is None or round(ip.fun) > len(nodes_of[0]):
            return None
        pools = [list(g) for g in types]
        nodes: list[list[int]] = [[] for _ in range(self.N)]
        for k in np.flatnonzero(np.round(ip.x)):
            c, a = cols[k]
            for _ in range(round(ip.x[k])):
                nd = nodes[nodes_of[c].pop()]
                for t, m in enumerate(a):  # where the patterns hold more jobs of a type than
                    nd += pools[t][:m]     # there are, the last nodes get fewer
                    del pools[t][:m]
        segments = self._segments(nodes, T)  # each node's best plan, not the first that ends by T
        return segments if segments is not None and max(s.end_s for s in segments) <= by else None

    def _area(self, j: int, W: float) -> float:
        """Least GPU-seconds for job j on one node within W, in whole epochs (inf if none)."""
        E = self.jobs[j].epochs
        menu = Menu(self.D[j, :self.K] / self.p.jobs[j].epochs, self.hulls[j].counts, 1)
        options = plans(menu, E, W, self.p.resize_cost_s)
        return options[0][0] if options else math.inf

    @staticmethod
    def _fills(y: np.ndarray, area: np.ndarray, count: np.ndarray, room: float, c: int) -> set:
        """Patterns of class c filled greedily by y / area, one from each of the best types."""
        order = [t for t in np.argsort(-y / area, kind="stable") if y[t] > 1e-9 and area[t] <= room]
        out = set()
        for first in order[:FILL_STARTS]:
            a = [0] * len(y)
            a[first], used = 1, area[first]
            for t in order:
                k = int(min(count[t] - a[t], (room - used) // area[t]))
                if k > 0:
                    a[t] += k
                    used += k * area[t]
            out.add((c, tuple(a)))
        return out

    @staticmethod
    def _changes(c: int, a: tuple[int, ...], y: np.ndarray, count: np.ndarray) -> set:
        """Pattern (c, a) with a job of a type worth something added, or one of its jobs
        swapped for such a job, or for two (the second of the CHANGE_TYPES worth most)."""
        worth = [t for t in np.argsort(-y, kind="stable") if y[t] > 1e-9]
        one = np.eye(len(y), dtype=int)
        a = np.array(a)
        rows = [a + one[worth]]
        for s in np.flatnonzero(a):
            swapped = a - one[s] + one[[t for t in worth if t != s]]
            rows += [swapped, (swapped[:, None] + one[worth[:CHANGE_TYPES]]).reshape(-1, len(y))]
        out = np.vstack(rows)
        return {(c, tuple(b)) for b in out[(out <= count).all(axis=1)].tolist()}
