"""Packing jobs into a time grid for a target makespan, then into concrete GPUs.

Used by the `omru` policy (policies/omru.py). For a target makespan T every
job gets the plan of least GPU-seconds that ends by T from where it can
start: one GPU count, or two adjacent counts of its convex hull (the fluid
LP's mix, rounded to whole epochs; the second part pays the resize cost),
in either order. Plans are placed longest first, each at the earliest time
the grid has room for it (its plan recomputed for the window left when that
is later, then fitted to the units free then), so the jobs that need all of
[0, T] start at once and short ones fill the holes. Rounds that move the
items that ended late to the front follow, then, if items still end late,
rounds where the jobs of bundles that ended late get whole nodes.

The grid counts `units`: GPUs on a one-node cluster, else whole nodes. On
several nodes a job gets whole nodes (its GPU count a multiple of the node
size), or, when fewer GPUs than a node serve it best, it shares a node with
others: such jobs are first bundled, K lanes per node (longest first, each
into the lane gap that fits it best, lanes no longer than the bundle's
first job), and a bundle is placed as one node. Every job then runs on as
few nodes as its GPU count allows, and the times planned are the times of
the placement it gets. A job given more GPUs than its largest profiled count
(a node wider than that) runs on the first `max_gpus` of them, at that
count's time, and the rest stay idle.

Bucket rounding only makes the grid pessimistic: `Packer.segments` places
each part in the grid's order on the units it was given, as early as its
GPUs, its job and its arrival allow, never later than planned. `grow_tail`
then lets the job that ends last grow onto GPUs nothing uses any more.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from services.planner.core import fluid
from services.planner.core.engine import restart_cost
from services.planner.core.model import PlanningInput, Segment

#: Grid buckets over the target makespan.
BUCKETS = 2000
#: A plan this much dearer in GPU-seconds may win when it keeps the grid flatter.
AREA_SLACK = 0.005


@dataclass
class Grid:
    """Units in use per time bucket of `dt` seconds, from the planning start."""

    units: int
    dt: float
    used: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    top: int = 0  # the bucket after the last one in use
    _blocked: dict = field(default_factory=dict)  # units -> buckets too full for them, cumulated

    def buckets(self, seconds: float) -> int:
        return max(1, math.ceil(seconds / self.dt - 1e-9))

    def _room(self, size: int) -> None:
        if len(self.used) < size:
            self.used = np.concatenate((self.used, np.zeros(max(size, 2 * len(self.used)) - len(self.used), np.int32)))

    def earliest(self, shape: list[tuple[int, int]], s0: int) -> int:
        """First bucket >= s0 where the parts (units, buckets), back to back, fit."""
        total = sum(b for _, b in shape)
        last = self.top
        if s0 >= last:
            return s0
        end = last + total + 1  # the buckets looked at: all are free from `last` on
        self._room(end)
        span = last - s0 + 1  # starting at `last` always fits
        ok = np.ones(span, dtype=bool)
        off = s0
        for units, b in shape:
            bad = self._blocked.get(units)
            if bad is None or len(bad) < end + 1:
                bad = self._blocked[units] = np.concatenate(([0], np.cumsum(self.used[:end] > self.units - units)))
            ok &= bad[off + b:off + b + span] == bad[off:off + span]
            off += b
        return s0 + int(np.argmax(ok))

    def room(self, s: int) -> int:
        """Units free in bucket s."""
        return self.units - (int(self.used[s]) if s < len(self.used) else 0)

    def peak(self, shape: list[tuple[int, int]], s: int) -> int:
        """The most units in use during the parts if they start at bucket s."""
        self._room(s + sum(b for _, b in shape))
        top = 0
        for units, b in shape:
            top = max(top, int(self.used[s:s + b].max()) + units)
            s += b
        return top

    def add(self, shape: list[tuple[int, int]], s: int) -> None:
        self._room(s + sum(b for _, b in shape))
        for units, b in shape:
            self.used[s:s + b] += units
            s += b
        self.top = max(self.top, s)
        self._blocked.clear()


@dataclass(frozen=True)
class Menu:
    """One job's options in grid units: epoch seconds by unit count (index u-1), and its hull."""

    tau: np.ndarray
    hull: tuple[int, ...]
    gpus_per_unit: int


def plans(menu: Menu, epochs: int, window: float, rc: float,
          room: int | None = None) -> list[tuple[float, tuple[tuple[int, int], ...]]]:
    """Plans [(GPU-seconds, ((units, epochs), ...))] that finish `epochs` within `window`, least first.

    One count (the least GPU-seconds that meets the window), or a mix of two
    adjacent hull counts with the resize cost on the second part, in both
    orders. With `room` (units free now), the counts that fit it instead:
    `room` itself and every hull count below, alone or mixed with any smaller
    hull count. Empty when nothing meets the window.
    """
    t, K = menu.tau, menu.gpus_per_unit
    out = []
    area = epochs * t * np.arange(1, len(t) + 1) * K
    ok = epochs * t <= window * (1 + 1e-12)
    if room is not None:
        ok[room:] = False
    if ok.any():
        u = int(np.argmin(np.where(ok, area, np.inf))) + 1
        out.append((float(area[u - 1]), ((u, epochs),)))
    cs = menu.hull
    pairs = list(zip(cs, cs[1:]))
    if room is not None:
        tops = sorted({c for c in cs if c <= room} | {room})
        pairs = [(a, b) for b in tops for a in cs if a < b]
        if epochs * t[room - 1] <= window:
            out.append((float(area[room - 1]), ((room, epochs),)))
    for a, b in pairs:
        ta, tb = t[a - 1], t[b - 1]
        x = wide_epochs(epochs, ta, tb, window, rc)
        if x:
            work = (x * tb * b + (epochs - x) * ta * a) * K
            out.append((work + rc * a * K, ((b, x), (a, epochs - x))))
            out.append((work + rc * b * K, ((a, epochs - x), (b, x))))
    out.sort(key=lambda p: p[0])
    return out


def wide_epochs(epochs: int, t_narrow: float, t_wide: float, window: float, rc: float) -> int:
    """Fewest of `epochs` to run at t_wide seconds each so that the rest at t_narrow, after one
    restart of rc seconds, end within `window`; 0 when t_narrow alone meets it, or when even
    all but one epoch wide does not (the fluid mix of two counts, in whole epochs)."""
    if epochs * t_narrow <= window or t_wide >= t_narrow:
        return 0
    x = math.ceil((epochs * t_narrow - (window - rc)) / (t_narrow - t_wide) - 1e-9)
    return x if 0 < x < epochs else 0


def fastest(menu: Menu, epochs: int) -> tuple[tuple[int, int], ...]:
    return ((menu.hull[-1], epochs),)


@dataclass
class Item:
    """What the grid places: a job's parts, or a bundle of small jobs sharing one node."""

    job: int  # -1 for a bundle
    parts: tuple[tuple[int, int], ...] = ()  # (units, epochs)
    lanes: list = field(default_factory=list)  # bundle: (job, lanes, offset_s, seconds)
    length_s: float = 0.0  # bundle length
    start: int = 0  # bucket
    shape: list = field(default_factory=list)  # (units, buckets)

    def end(self) -> int:
        return self.start + sum(b for _, b in self.shape)


class Packer:
    """The grid plan for one target makespan (see module docstring)."""

    def __init__(self, problem: PlanningInput, start_s: float = 0.0, busy_until: list[float] | None = None,
                 not_before: list[float] | None = None,
                 history: dict[int, tuple[tuple[int, ...], float]] | None = None) -> None:
        """`busy_until[g]`: when GPU g is free; `not_before[j]`: job j's earliest start;
        `history[j]`: GPUs and end of job j's last committed segment (its next one pays a restart)."""
        self.p = problem
        c = problem.cluster
        self.K = c.gpus_per_node
        self.by_node = c.nodes > 1
        self.unit = self.K if self.by_node else 1  # GPUs per grid unit
        self.units = c.nodes if self.by_node else c.gpus
        self.rc = problem.resize_cost_s
        self.narrow_first = False  # see _choice
        self.start_s = start_s
        self.epochs = [j.epochs for j in problem.jobs]
        self.not_before = not_before or [max(start_s, j.arrival_s) for j in problem.jobs]
        self.busy_until = busy_until or [start_s] * c.gpus
        self.history = dict(history or {})
        self.first_cost = [self.rc if j in self.history else 0.0 for j in range(len(problem.jobs))]
        self.menus = [self._menu(j) for j in problem.jobs]
        # Sub-node options (bundled on one node): epoch seconds on 1..K-1 GPUs of one node.
        self.small = [np.array([j.epoch_seconds(g, 1) for g in range(1, min(self.K, j.max_gpus + 1))])
                      if self.by_node else None for j in problem.jobs]

    def _menu(self, job) -> Menu:
        u, G = self.unit, self.p.cluster.gpus
        tau = np.fromiter(job.table(G), float, G)[u - 1::u].copy()  # t(m u); above max_gpus, t(max_gpus)
        if job.placement:
            for m in range(1, self.units + 1):  # the placement's time where the job has one
                g = min(m * u, job.max_gpus)  # (the GPUs it runs on, see _segment)
                tau[m - 1] = job.epoch_seconds(g, self.p.cluster.fewest_hosts(-(-g // u)) if self.by_node else 1)
        return Menu(tau, fluid.hull_of(tau * job.epochs).counts, u)

    # ------------------------------------------------------------ the grid plan

    def pack(self, T: float, rounds: int = 1) -> tuple[Grid, list[Item]]:
        """Place every job for target makespan T (seconds from the planning start).

        Longest first (long bundles, which cannot change shape, before the
        rest); each further round moves the items that ended after T to the
        front and packs again. If items still end late, half as many rounds
        follow with the jobs of the bundles that ended late in the best round
        on whole nodes of their own (on a whole node a job runs shorter and
        finds room where a long bundle does not). Returns the grid that ends
        first.
        """
        best, solo = None, set()
        for tries in (rounds, rounds // 2):
            if not tries:
                break
            items = self.items(T, solo)
            order = sorted(range(len(items)), key=lambda i: (not (items[i].job < 0 and items[i].length_s > T / 2),
                                                           -items[i].length_s, i))
            for _ in range(tries):
                grid = self.place(items, order, T)
                late = [i for i in order if items[i].end() * grid.dt > T * (1 + 1e-9)]
                if best is None or grid.top < best[0]:
                    best = (grid.top, grid, [dataclasses.replace(it) for it in items],
                            {j for i in late if items[i].job < 0 for j, *_ in items[i].lanes})
                if not late:
                    return best[1], best[2]
                first = set(late)
                order = late + [i for i in order if i not in first]
            if not best[3] - solo:
                break
            solo |= best[3]
        return best[1], best[2]

    def items(self, T: float, solo: set[int] | frozenset[int] = frozenset()) -> list[Item]:
        """One item per job, except jobs best served by part of a node (and not in `solo`),
        which go into bundles."""
        items, small = [], []
        for j in range(len(self.p.jobs)):
            W = T - (self.not_before[j] - self.start_s)
            big = plans(self.menus[j], self.epochs[j], W, self.rc)
            little = None if j in solo else self._small(j, W)
            if little is not None and (not big or little[0] <= big[0][0]) and self.not_before[j] <= self.start_s:
                small.append((little[2], j, little[1]))
            else:
                parts = big[0][1] if big else fastest(self.menus[j], self.epochs[j])
                items.append(Item(j, length_s=self._seconds(j, parts)))
        return items + self._bundles(small)

    def place(self, items: list[Item], order: list[int], T: float) -> Grid:
        grid = Grid(self.units, T / BUCKETS)
        self._busy(grid)
        for i in order:
            self._place(grid, items[i], T)
        return grid

    def _busy(self, grid: Grid) -> None:
        """GPUs still busy at the start (committed segments) keep their unit busy until they end."""
        ends: dict[int, float] = {}
        for g, t in enumerate(self.busy_until):
            u = g // self.unit
            ends[u] = max(ends.get(u, self.start_s), t)
        for t in ends.values():
            if t > self.start_s:
                grid.add([(1, grid.buckets(t - self.start_s))], 0)

    def _small(self, j: int, W: float):
        """(GPU-seconds, GPUs, seconds) of the best count below a node that meets W, or None."""
        t = self.small[j]
        if t is None or not len(t):
            return None
        d = self.epochs[j] * t + self.first_cost[j]
        area = d * np.arange(1, len(t) + 1)
        ok = d <= W * (1 + 1e-12)
        if not ok.any():
            return None
        g = int(np.argmin(np.where(ok, area, np.inf))) + 1
        return float(area[g - 1]), g, float(d[g - 1])

    def _seconds(self, j: int, parts) -> float:
        tau = self.menus[j].tau
        return sum(x * tau[u - 1] for u, x in parts) + self.rc * (len(parts) - 1) + self.first_cost[j]

    def _shape(self, grid: Grid, j: int, parts) -> list[tuple[int, int]]:
        tau = self.menus[j].tau
        return [(u, grid.buckets(x * tau[u - 1] + (self.rc if k else self.first_cost[j])))
                for k, (u, x) in enumerate(parts)]

    def _place(self, grid: Grid, it: Item, T: float) -> None:
        if it.job < 0:
            it.shape = [(1, grid.buckets(it.length_s))]
            it.start = grid.earliest(it.shape, 0)
            grid.add(it.shape, it.start)
            return
        j = it.job
        s0 = grid.buckets(self.not_before[j] - self.start_s) if self.not_before[j] > self.start_s else 0
        s, best = s0, None
        for _ in range(4):
            options = plans(self.menus[j], self.epochs[j], T - s * grid.dt, self.rc)[:3]
            found = self._choice(grid, j, options, s)
            room = grid.room(s)
            if (found is None or found[0] > s) and room > 0:  # what fits the units free now
                fitted = self._choice(grid, j, plans(self.menus[j], self.epochs[j], T - s * grid.dt, self.rc, room), s)
                if fitted is not None and (found is None or fitted[0] < found[0]):
                    found = fitted
            if found is None:
                break
            best = found
            if best[0] == s:
                break
            s = best[0]
        if best is None:
            parts = fastest(self.menus[j], self.epochs[j])
            shape = self._shape(grid, j, parts)
            best = (grid.earliest(shape, s0), parts, shape)
        it.start, it.parts, it.shape = best
        grid.add(it.shape, it.start)

    def _choice(self, grid: Grid, j: int, options, s: int):
        """(start, parts, shape) of the plan that starts earliest, then costs the least
        GPU-seconds; within AREA_SLACK of that, the one that keeps the grid flattest.

        With `narrow_first`, the slack also covers one restart on one unit (the
        price of growing rather than shrinking), and among the flattest the plan
        that starts on fewer units wins: its wide part runs later, on GPUs that
        jobs finishing before it released, while the units it leaves free start
        jobs that wait, so they finish sooner."""
        tried = []
        for area, parts in options:
            shape = self._shape(grid, j, parts)
            at = grid.earliest(shape, s)
            tried.append((at, area, parts, shape))
        if not tried:
            return None
        first = min(t[0] for t in tried)
        tried = [t for t in tried if t[0] == first]
        cheapest = min(t[1] for t in tried)
        slack = cheapest * AREA_SLACK + (self.rc * self.menus[j].gpus_per_unit if self.narrow_first else 0.0)
        near = [t for t in tried if t[1] <= cheapest + slack]
        at, _, parts, shape = min(near, key=lambda t: (grid.peak(t[3], t[0]), t[2][0][0] if self.narrow_first else 0, t[1]))
        return at, parts, shape

    def _bundles(self, small: list[tuple[float, int, int]]) -> list[Item]:
        """Small jobs (seconds, job, GPUs) into node bundles of K lanes, longest first: a one-GPU
        job into the lane gap that fits it best, a wider one onto the emptiest lanes of the
        newest bundle, else a new bundle as long as the job."""
        K = self.K
        bundles: list[Item] = []
        gaps: list[tuple[float, int, int]] = []  # (free seconds at a lane's end, bundle, lane)
        fills: list[list[float]] = []
        for d, j, g in sorted(small, key=lambda x: (-x[0], x[1])):
            placed = False
            if g == 1:
                k = bisect.bisect_left(gaps, (d - 1e-9, -1, -1))
                if k < len(gaps):
                    _, b, lane = gaps.pop(k)
                    self._lane(bundles[b], fills[b], gaps, b, [lane], j, d)
                    placed = True
            if not placed and bundles:
                b = len(bundles) - 1
                lanes = sorted(range(K), key=lambda ln: fills[b][ln])[:g]
                if max(fills[b][ln] for ln in lanes) + d <= bundles[b].length_s * (1 + 1e-12):
                    self._unlist(gaps, b, lanes)
                    self._lane(bundles[b], fills[b], gaps, b, lanes, j, d)
                    placed = True
            if not placed:
                bundles.append(Item(-1, length_s=d))
                fills.append([0.0] * K)
                self._lane(bundles[-1], fills[-1], gaps, len(bundles) - 1, list(range(g)), j, d)
                for ln in range(g, K):
                    bisect.insort(gaps, (d, len(bundles) - 1, ln))
        return bundles

    @staticmethod
    def _unlist(gaps, b: int, lanes: list[int]) -> None:
        gaps[:] = [x for x in gaps if not (x[1] == b and x[2] in lanes)]

    @staticmethod
    def _lane(bundle: Item, fill: list[float], gaps, b: int, lanes: list[int], j: int, d: float) -> None:
        start = max(fill[ln] for ln in lanes)
        bundle.lanes.append((j, tuple(lanes), start, d))
        for ln in lanes:
            fill[ln] = start + d
        if len(lanes) == 1 and bundle.length_s - fill[lanes[0]] > 0:
            bisect.insort(gaps, (bundle.length_s - fill[lanes[0]], b, lanes[0]))

    # ------------------------------------------------------------ concrete segments

    def segments(self, grid: Grid, items: list[Item]) -> list[Segment]:
        """GPU ids and times for every part, in grid order, each as early as it can start."""
        unit = self.unit
        free_at = list(self.busy_until)  # exact, per GPU
        unit_end = [0] * self.units  # planned bucket at which each unit is free
        for g, t in enumerate(self.busy_until):
            unit_end[g // unit] = max(unit_end[g // unit], grid.buckets(t - self.start_s) if t > self.start_s else 0)
        last = dict(self.history)
        # a job that runs (committed history) keeps its own units when it goes on: it picks before the
        # parts that start with it, which would otherwise take the units that came free last, its own
        # (two running jobs would swap GPUs: neither can move before the other left)
        home = {j: tuple(sorted({x // unit for x in gpus})) for j, (gpus, _) in self.history.items()}
        out: list[Segment] = []
        parts = []  # (start bucket, not a running job's first part, item, part index)
        for i, it in enumerate(items):
            s = it.start
            for k, (_, b) in enumerate(it.shape):
                parts.append((s, not (k == 0 and it.job in home), i, k))
                s += b
        held: dict[tuple[int, int], tuple[int, ...]] = {}  # (item, part) -> units
        for s, _, i, k in sorted(parts):
            it = items[i]
            n_units, b = it.shape[k]
            prev = held.get((i, k - 1)) or (home.get(it.job, ()) if k == 0 else ())
            pool = [u for u in range(self.units) if unit_end[u] <= s]
            # keep what it can of its own units, then the units that came free last
            mine = [u for u in prev if unit_end[u] <= s]
            rest = sorted(set(pool) - set(mine), key=lambda u: (-unit_end[u], u))
            units = tuple(sorted((mine + rest)[:n_units]))
            assert len(units) == n_units, "grid over-committed"
            held[(i, k)] = units
            for u in units:
                unit_end[u] = s + b
            if it.job < 0:  # a bundle: its jobs lane by lane on the node's GPUs
                base = units[0] * self.K
                for j, lanes, _, _ in sorted(it.lanes, key=lambda x: x[2]):
                    out.append(self._segment(j, tuple(base + ln for ln in lanes), self.epochs[j], free_at, last))
                continue
            gpus = tuple(x for u in units for x in range(u * unit, (u + 1) * unit))
            out.append(self._segment(it.job, gpus, it.parts[k][1], free_at, last))
        return out

    def _segment(self, j: int, gpus: tuple[int, ...], epochs: int, free_at, last) -> Segment:
        """Job j's next segment on `gpus` (the first max_gpus of them), as early as they, the job and
        its arrival allow."""
        p = self.p
        job = p.jobs[j]
        gpus = gpus[:job.max_gpus]
        prev = last.get(j)
        start = max([self.not_before[j]] + [free_at[x] for x in gpus] + ([prev[1]] if prev else []))
        end = start + restart_cost(p, prev, gpus, start) + epochs * job.epoch_seconds(
            len(gpus), p.cluster.nodes_spanned(gpus))
        for x in gpus:
            free_at[x] = end
        last[j] = (gpus, end)
        return Segment(job.id, start, end, gpus, epochs)


def grow_tail(problem: PlanningInput, segments: list[Segment], busy_until: list[float],
              rounds: int) -> list[Segment]:
    """Shorten a plan from its end: the job that ends last moves, after some epochs of its last
    segment, onto more GPUs that nothing uses from then on (its own, and others that come free;
    up to a node's worth on one node, or whole nodes; never more than its max_gpus), pausing
    until they are free when that pays, if that ends it earlier after the resize cost. Repeats
    while the makespan falls, `rounds` at most.
    """
    segs = list(segments)
    c = problem.cluster
    K = c.gpus_per_node
    jobs = {j.id: j for j in problem.jobs}
    for _ in range(rounds):
        if not segs:
            break
        last = max(range(len(segs)), key=lambda i: segs[i].end_s)
        s = segs[last]
        job = jobs[s.job]
        free_at = list(busy_until)
        for other in segs:
            if other is not s:
                for g in other.gpus:
                    free_at[g] = max(free_at[g], other.end_s)
        tau = job.epoch_seconds(len(s.gpus), c.nodes_spanned(s.gpus))
        rc = problem.resize_cost_s
        paid = rc if s.end_s - s.start_s - s.epochs * tau > rc / 2 else 0.0  # its restart, if any
        first = s.start_s + paid  # when its first epoch starts
        for g in s.gpus:
            free_at[g] = first  # its own: free once it stops
        best = None
        for count, spanned, ready, gpus in _wider(free_at, len(s.gpus), K, c.nodes):
            if (best is not None and ready >= best[0]) or count > job.max_gpus:
                break  # the rest are ready later still, or wider than the job can run
            t_new = job.epoch_seconds(count, spanned)
            done = max(1, math.floor((ready - first) / tau + 1e-9))
            for k in (done, done + 1):  # stop at the boundary before it is ready and wait, or after
                if k >= s.epochs:
                    continue
                at = max(first + k * tau, ready)
                end = at + rc + (s.epochs - k) * t_new
                if end < s.end_s * (1 - 1e-9) and (best is None or end < best[0]):
                    best = (end, k, at, gpus)
        if best is None:
            break
        end, k, at, gpus = best
        gpus = gpus()
        segs[last] = Segment(s.job, s.start_s, first + k * tau, s.gpus, k)
        segs.append(Segment(s.job, at, end, gpus, s.epochs - k))
    return segs


def _wider(free_at: list[float], g: int, K: int, nodes: int):
    """(count, nodes spanned, when all are free, GPUs as a call) for every count above g: on one
    node up to K GPUs (the earliest free of each node), whole nodes beyond (the earliest free
    nodes). The whole nodes come last, the ones ready later after."""
    per_node = [sorted((free_at[x], x) for x in range(n * K, (n + 1) * K)) for n in range(nodes)]
    for count in range(g + 1, K + 1):
        n = min(range(nodes), key=lambda m: (per_node[m][count - 1][0], m))
        yield count, 1, per_node[n][count - 1][0], lambda n=n, count=count: tuple(sorted(x for _, x in per_node[n][:count]))
    by_ready = sorted(range(nodes), key=lambda m: (per_node[m][-1][0], m))
    for m in range(max(2, -(-(g + 1) // K)), nodes + 1):
        yield m * K, m, per_node[by_ready[m - 1]][-1][0], lambda m=m: tuple(
            sorted(x for n in by_ready[:m] for x in range(n * K, (n + 1) * K)))
