"""A discrete-event plan builder shared by the event-driven policies.

The engine owns time, GPUs and segments; a policy only decides. At every
decision time (an arrival, a segment's end, GPUs coming free, a policy's
quantum tick) the engine calls `policy.step(engine)`, and the policy calls
`start`, `resize` and `preempt`. The engine then makes the plan true to the
cluster, so every policy built on it keeps the validator's rules by
construction:

- concrete GPU ids, chosen to keep a job on as few nodes as possible
  (its own nodes first when it grows), and the epoch time of the placement
  actually chosen (`Job.epoch_seconds(gpus, nodes)`);
- changes happen at epoch boundaries: resizing or preempting a running job
  cuts its segment at the next epoch boundary, and the new GPU set starts
  there;
- a segment that does not continue the job's previous segment on the same
  GPUs at the same instant pays `resize_cost_s` (checkpoint + restart) on
  top of its epochs;
- no job starts before its arrival;
- no job runs on more GPUs than its largest profiled count (`Job.max_gpus`):
  a start or resize asking more gets that many.

`committed` segments (from an online replay) are fixed history: their GPUs
are busy until they end, and a job may continue on its committed GPUs at
their end without paying a restart.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Iterable, Protocol

from services.planner.core.model import Plan, PlanningInput, Segment, Unplaced

EPS = 1e-9


class EnginePolicy(Protocol):
    #: Seconds between forced decision times while work is left, or None.
    quantum_s: float | None

    def step(self, engine: "Engine") -> None: ...


@dataclass
class Run:
    """A job's current segment: `epochs` epochs on `gpus` from `start` (+ `cost` restart)."""

    job: int
    gpus: tuple[int, ...]
    start: float
    cost: float
    tau: float
    epochs: int

    @property
    def end(self) -> float:
        return self.start + self.cost + self.epochs * self.tau

    def epochs_by(self, t: float) -> int:
        """Epochs finished at the first epoch boundary at or after t (at least 1)."""
        return epochs_by(self.start + self.cost, self.tau, self.epochs, t)


def epochs_by(first: float, tau: float, epochs: int, t: float) -> int:
    """Of `epochs` epochs of tau seconds from `first`, those finished at the first epoch
    boundary at or after t (at least 1)."""
    k = math.ceil((t - first) / tau - 1e-9)
    return min(max(k, 1), epochs)


def restart_cost(problem: PlanningInput, prev: tuple[tuple[int, ...], float] | None,
                 gpus: tuple[int, ...], start: float) -> float:
    """What a segment on `gpus` starting at `start` pays after the job's previous segment `prev`.

    Nothing for a job's first segment or one that continues its previous
    segment on the same GPUs at the same instant; else the resize cost.
    """
    if prev is None:
        return 0.0
    last_gpus, last_end = prev
    tol = EPS * max(1.0, abs(start))
    if tuple(sorted(last_gpus)) == tuple(sorted(gpus)) and abs(start - last_end) <= tol:
        return 0.0
    return problem.resize_cost_s


class Engine:
    """Builds one plan for `problem` under `policy`. Use `run()`."""

    def __init__(self, problem: PlanningInput, policy: EnginePolicy, start_s: float = 0.0,
                 committed: Iterable[Segment] = ()) -> None:
        self.problem = problem
        self.policy = policy
        self.cluster = problem.cluster
        self.K = problem.cluster.gpus_per_node
        self.G = problem.cluster.gpus
        self.jobs = problem.jobs
        n = len(self.jobs)
        self.index = {j.id: i for i, j in enumerate(self.jobs)}
        self.now = start_s
        self.remaining = [j.epochs for j in self.jobs]  # epochs not yet in any run
        self.not_before = [max(start_s, j.arrival_s) for j in self.jobs]
        self.last: list[tuple[tuple[int, ...], float] | None] = [None] * n
        self.served = [0.0] * n  # GPU-seconds of finished segments (for LAS)
        self.ran_s = [0.0] * n  # seconds of finished segments (for time shares)
        self.running: dict[int, Run] = {}
        self._idle = set(range(n))  # work left and not running
        self._wake: list[float] = []  # future not_before times
        self.segments: list[Segment] = []
        self.holder = [-1] * self.G
        self.node_free: list[set[int]] = [set(range(k * self.K, (k + 1) * self.K)) for k in range(self.cluster.nodes)]
        self.free_count = self.G
        self._pending: list[tuple[float, int]] = []  # (free_at, gpu) not yet usable
        self._wake = [t for t in self.not_before if t > start_s]
        heapq.heapify(self._wake)
        busy_until = [start_s] * self.G
        for s in committed:
            i = self.index.get(s.job)
            for g in s.gpus:
                busy_until[g] = max(busy_until[g], s.end_s)
            if i is not None:
                heapq.heappush(self._wake, s.end_s)
                prev = self.last[i]
                if prev is None or s.end_s >= prev[1]:
                    self.last[i] = (tuple(s.gpus), s.end_s)
                self.not_before[i] = max(self.not_before[i], s.end_s)
        for g, t in enumerate(busy_until):
            if t > start_s + EPS:
                self._take_gpu(g)
                self.holder[g] = -1
                heapq.heappush(self._pending, (t, g))

    # ------------------------------------------------------------ queries

    def tau(self, j: int, g: int, nodes: int | None = None) -> float:
        """Epoch seconds of job j on g GPUs (over `nodes` nodes, else its best placement)."""
        return self.jobs[j].epoch_seconds(g, nodes)

    def waiting(self) -> list[int]:
        """Jobs that could start now: arrived, work left, not running."""
        now = self.now + EPS * max(1.0, self.now)
        return sorted(j for j in self._idle if self.not_before[j] <= now)

    def next_arrival(self) -> float:
        """When the next job arrives or comes out of committed history (inf if none will)."""
        later = [self.not_before[j] for j in self._idle if self.not_before[j] > self.now + EPS * max(1.0, self.now)]
        return min(later, default=math.inf)

    def future_work(self) -> bool:
        return bool(self._idle) or bool(self.running)

    def attained(self, j: int) -> float:
        """GPU-seconds job j has had so far (running time counted up to now)."""
        r = self.running.get(j)
        extra = max(0.0, self.now - r.start) * len(r.gpus) if r is not None else 0.0
        return self.served[j] + extra

    def time_received(self, j: int) -> float:
        r = self.running.get(j)
        return self.ran_s[j] + (max(0.0, self.now - r.start) if r is not None else 0.0)

    # ------------------------------------------------------------ actions

    def start(self, j: int, g: int, epochs: int | None = None) -> bool:
        """Start waiting job j on g free GPUs now (at most its max_gpus), for `epochs` of its epochs
        (all that are left if None; it waits again after them); False if g GPUs are not free."""
        g = min(g, self.jobs[j].max_gpus)
        if j in self.running or self.remaining[j] <= 0 or g > self.free_count or g <= 0:
            return False
        prev = self.last[j]
        keep = ()
        if prev is not None and abs(prev[1] - self.now) <= EPS * max(1.0, self.now) and len(prev[0]) <= g \
                and all(self.holder[x] == -1 and x in self.node_free[x // self.K] for x in prev[0]):
            keep = prev[0]
        gpus = self._pick(g, keep=keep)
        self._open(j, gpus, self.now, min(epochs or self.remaining[j], self.remaining[j]))
        return True

    def resize(self, j: int, g: int) -> float | None:
        """Move running job j to g GPUs (at most its max_gpus) from its next epoch boundary; returns
        its new end, or None."""
        g = min(g, self.jobs[j].max_gpus)
        r = self.running.get(j)
        if r is None or g == len(r.gpus) or r.start > self.now + EPS:
            return None
        if g > len(r.gpus) and g - len(r.gpus) > self.free_count:
            return None
        if r.epochs_by(self.now) >= r.epochs:  # it finishes at the boundary anyway
            return None
        b = self._cut(j)
        own = r.gpus
        if g > len(own):
            extra = self._pick(g - len(own), prefer_nodes={x // self.K for x in own})
            gpus = tuple(sorted(own + extra))
        else:
            gpus = self._shrink(own, g)
            for x in own:
                if x not in gpus:
                    self._release(x, b)
        self._open(j, gpus, b, self.remaining[j], holding=True)
        return self.running[j].end

    def preempt(self, j: int) -> float | None:
        """Stop running job j at its next epoch boundary; returns that time."""
        r = self.running.get(j)
        if r is None or r.start > self.now + EPS:
            return None
        b = self._cut(j)
        for x in r.gpus:
            self._release(x, b)
        del self.running[j]
        self.not_before[j] = max(self.not_before[j], b)
        heapq.heappush(self._wake, self.not_before[j])
        if self.remaining[j] > 0:
            self._idle.add(j)
        return b

    def projected_end(self, j: int, g: int, at: float | None = None) -> float:
        """When running job j would end if moved to g GPUs (best placement) at its first
        epoch boundary at or after `at` (default: now)."""
        r = self.running[j]
        k = r.epochs_by(self.now if at is None else at)
        b = r.start + r.cost + k * r.tau
        left = r.epochs - k
        if left <= 0:
            return b
        return b + self.problem.resize_cost_s + left * self.tau(j, g)

    # ------------------------------------------------------------ the loop

    def run(self, name: str) -> Plan:
        quantum = self.policy.quantum_s
        guard = 0
        while True:
            self._advance()
            if not self.future_work():
                break
            self.policy.step(self)
            nxt = [r.end for r in self.running.values()]
            nxt += [self._pending[0][0]] if self._pending else []
            while self._wake and self._wake[0] <= self.now + EPS * max(1.0, self.now):
                heapq.heappop(self._wake)
            nxt += self._wake[:1]
            nxt += [r.start for r in self.running.values() if r.start > self.now + EPS]
            if quantum and (self.running or self.waiting()):
                nxt.append(self.now + quantum)
            nxt = [t for t in nxt if t > self.now + EPS * max(1.0, self.now)]
            if not nxt:
                break  # nothing will ever change: what is left cannot be placed
            self.now = min(nxt)
            guard += 1
            if guard > 10_000_000:
                raise AssertionError("engine did not terminate")
        unplaced = tuple(Unplaced(self.jobs[j].id, "no GPUs could be given to it")
                         for j in range(len(self.jobs)) if self.remaining[j] > 0)
        # A job left unplaced is listed as such; its partial segments are dropped.
        drop = {u.job for u in unplaced}
        segments = tuple(s for s in self.segments if s.job not in drop)
        return Plan(name, segments, None, unplaced)

    # ------------------------------------------------------------ internals

    def _advance(self) -> None:
        tol = EPS * max(1.0, self.now)
        for j in [j for j, r in self.running.items() if r.end <= self.now + tol]:
            r = self.running.pop(j)
            self._emit(r)
            for x in r.gpus:
                self._release(x, r.end)
            if self.remaining[j] > 0:  # it ran only part of its epochs: it waits again
                self._idle.add(j)
        while self._pending and self._pending[0][0] <= self.now + tol:
            _, x = heapq.heappop(self._pending)
            if self.holder[x] == -1 and x not in self.node_free[x // self.K]:
                self.node_free[x // self.K].add(x)
                self.free_count += 1

    def _emit(self, r: Run) -> None:
        if r.epochs <= 0:
            return
        job = self.jobs[r.job]
        self.segments.append(Segment(job.id, r.start, r.end, r.gpus, r.epochs))
        self.last[r.job] = (r.gpus, r.end)
        self.served[r.job] += r.epochs * r.tau * len(r.gpus)
        self.ran_s[r.job] += r.end - r.start

    def _open(self, j: int, gpus: tuple[int, ...], start: float, epochs: int, holding: bool = False) -> None:
        nodes = self.cluster.nodes_spanned(gpus)
        tau = self.tau(j, len(gpus), nodes)
        cost = restart_cost(self.problem, self.last[j], gpus, start)
        for x in gpus:
            self.holder[x] = j
        self.running[j] = Run(j, gpus, start, cost, tau, epochs)
        self.remaining[j] -= epochs
        self._idle.discard(j)

    def _cut(self, j: int) -> float:
        """End job j's run at its next epoch boundary (segment emitted); returns the boundary."""
        r = self.running[j]
        k = r.epochs_by(self.now)
        self.remaining[j] += r.epochs - k
        r.epochs = k
        self._emit(r)
        return r.end

    def _release(self, x: int, at: float) -> None:
        self.holder[x] = -1
        if at <= self.now + EPS * max(1.0, self.now):
            if x not in self.node_free[x // self.K]:
                self.node_free[x // self.K].add(x)
                self.free_count += 1
        else:
            heapq.heappush(self._pending, (at, x))

    def _take_gpu(self, x: int) -> None:
        s = self.node_free[x // self.K]
        if x in s:
            s.remove(x)
            self.free_count -= 1

    def _pick(self, g: int, keep: tuple[int, ...] = (), prefer_nodes: set[int] | None = None) -> tuple[int, ...]:
        """g free GPUs on as few nodes as possible: `keep` first, then preferred
        nodes, whole free nodes, the best-fitting node, then the emptiest nodes."""
        taken: list[int] = list(keep)
        for x in keep:
            self._take_gpu(x)
        free = self.node_free

        def take(node: int, k: int) -> None:
            ids = sorted(free[node])[:k]
            for x in ids:
                self._take_gpu(x)
            taken.extend(ids)

        for node in sorted(prefer_nodes or (), key=lambda n: -len(free[n])):
            if len(taken) < g and free[node]:
                take(node, g - len(taken))
        while g - len(taken) >= self.K:
            node = next((n for n in range(len(free)) if len(free[n]) == self.K), None)
            if node is None:
                break
            take(node, self.K)
        while len(taken) < g:
            rest = g - len(taken)
            fit = min((n for n in range(len(free)) if len(free[n]) >= rest), key=lambda n: (len(free[n]), n), default=None)
            if fit is None:
                fit = max((n for n in range(len(free)) if free[n]), key=lambda n: (len(free[n]), -n))
            take(fit, rest)
        return tuple(sorted(taken))

    def _shrink(self, own: tuple[int, ...], g: int) -> tuple[int, ...]:
        """Keep g of `own`, emptying the nodes it holds least of first."""
        by_node: dict[int, list[int]] = {}
        for x in own:
            by_node.setdefault(x // self.K, []).append(x)
        keep: list[int] = []
        for node in sorted(by_node, key=lambda n: (-len(by_node[n]), n)):
            keep += by_node[node][: g - len(keep)]
        return tuple(sorted(keep))


def resizes(plan: Plan) -> int:
    """Restarts in a plan: segments that do not continue their job's previous
    segment on the same GPUs at the same instant (each pays the resize cost)."""
    by_job: dict[str, list[Segment]] = {}
    for s in plan.segments:
        by_job.setdefault(s.job, []).append(s)
    count = 0
    for segs in by_job.values():
        segs.sort(key=lambda s: s.start_s)
        for a, b in zip(segs, segs[1:]):
            tol = EPS * max(1.0, abs(b.start_s))
            if tuple(sorted(a.gpus)) != tuple(sorted(b.gpus)) or abs(b.start_s - a.end_s) > tol:
                count += 1
    return count
