"""`omru`: fluid-guided packing, with fluid-guided list scheduling as a second opinion.

1. Solve the fluid relaxation exactly (core/fluid.py): its makespan T* is the
   fluid lower bound, and each job's convex hull of (time, GPU-seconds) says
   which GPU counts are efficient.
2. Packing (core/packing.py), for targets T = f T*, f = 1, 1.01, ... until
   f T* is no better than the best plan found, then twice halfway between
   the largest target missed and the best plan: each job gets the plan of
   least GPU-seconds that ends by T (one count, or the fluid mix of two
   hull counts rounded to whole epochs, with one resize), placed longest
   first at the earliest time a grid of whole nodes has room for it; jobs
   served best by part of a node share nodes in bundles. Items that end late
   go first in the next round; the jobs of bundles that still end late get
   whole nodes in the last rounds. Every job runs on as few nodes as its count
   allows, so the time planned is the time of the placement it gets. Last,
   the job that ends last grows onto GPUs nothing uses any more (on its
   node, or whole nodes) while that ends it earlier (packing.grow_tail; the
   list schedules of step 3 get the same). Batches small enough for step 3
   are also packed with `Packer.narrow_first` (a job mixing two counts
   starts on the fewer and grows onto GPUs that jobs ending before it
   release).
3. List scheduling on the event engine (core/engine.py), on batches up to
   LIST_MAX jobs x GPUs: for targets T around T*, each job starts on the
   fewest GPUs on its hull that finish what it has left by T (counted from
   when it starts: a job that starts late starts wider; if none can, the
   count that ends it first given when running jobs release GPUs), in one
   of two kinds of order: longest first, or least compressible first (by
   its time at the widest hull count that costs at most a few per cent more
   GPU-seconds: jobs that cannot catch up by running wide start first, jobs
   that can fill what the others leave). In the `mix` variant a job that
   must run wider than its target runs only the epochs it needs there, then
   the rest on the hull count below (the fluid mix, wide part first); in
   the `wide last` family, jobs whose fluid mix needs more than half the
   cluster start on its narrow count instead (two of them cannot both run
   wide first) and grow at the end. Once nothing waits, free GPUs go to the
   running jobs that end last when that ends them earlier even after the
   resize cost (the wrap-around the fluid optimum does with fractions); in
   the `patient` families a job waits for the GPUs the next running job
   releases when growing onto those too then ends it earlier still (one
   restart instead of two). The sweep over targets, orders and variants,
   most promising first, then local searches from the best starts of the
   families, the best first (moves, for the jobs that end last first: move
   the job to the front of the order, halfway there or one place up, or
   change its count, with or without its deadline), share a budget of
   engine passes that falls with the batch's size (RUNS).
4. Node packing (core/nodepack.py), on the same batches when the cluster
   has several nodes and nothing is committed, for targets f T* (f in
   NODE_FACTORS): each job on one node, each node's jobs list-scheduled on
   it alone (NODE_SLACK; SQUEEZES: each job as wide as a few per cent
   more GPU-seconds allow, so one that needs most of a node for much of the
   target frees all of it early), jobs moved between nodes; the few jobs that
   cannot meet the target on one node first run part of their epochs wide,
   on whole nodes of their own from the start. Then jobs go to nodes by
   column generation (node patterns, an LP and an integer program) for
   COLUMN_STEPS targets bisecting between T* and the best plan so far. The
   job that ends last then grows as in step 2.
5. The plan with the least makespan wins (then fewer resizes, then the
   earlier job completions). Option `makespan_tolerance` (a share, default
   0): makespans within it of the least count as equal, among the packings
   and every list schedule tried (the planner service sets it: measured
   epoch times are not exact to a percent, and plans that differ by less
   only trade resizes and later completions for noise).
6. Option `deadline_s` (seconds, default none) makes the search anytime: once
   that much wall time has passed since planning began, no further packing
   target, list schedule or node packing is tried and the best plan found so
   far wins. The first packing always completes, so a plan always comes. The
   planner service replans with a deadline (a cluster cannot wait for the full
   search); without one the plan depends only on the input.

The builders keep the validator's rules by construction: GPU ids, whole
epochs, placement times, resize costs, arrivals and committed history.
Packing plans 1,000 jobs on 1,024 GPUs in about a second; list scheduling,
whose passes grow with jobs x running jobs, is left out there.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass, field

from services.planner.core import fluid
from services.planner.core.engine import EPS, Engine, resizes
from services.planner.core.model import Plan, PlanningError, PlanningInput, Segment
from services.planner.core.nodepack import NodePacker
from services.planner.core.packing import Packer, grow_tail, wide_epochs
from services.planner.core.registry import register

#: Packing targets, as multiples of T*, tried in order while they can still win.
PACK_FACTORS = (1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.08, 1.12, 1.2, 1.35, 1.6, 2.0, 3.0)
#: Packing rounds per target (items that end late move to the front).
PACK_ROUNDS = 8
#: Times the job that ends a plan last may grow onto GPUs left idle (packing.grow_tail).
GROW_ROUNDS = 64
#: A packing that ends this share after its target missed it.
PACK_MISS = 0.002
#: List scheduling runs on batches up to this many jobs x GPUs.
LIST_MAX = 300_000
#: List-scheduling target makespans, as multiples of T* (plus hull breakpoints when few).
FACTORS = (1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.6, 2.0, 3.0)
#: Below this many hull breakpoints near T*, every one of them is tried.
EXHAUSTIVE_BREAKPOINTS = 120
#: Shares a job's area may grow by when it runs wide (the `stiff` orders; node schedules).
SQUEEZES = (0.05, 0.1, 0.2)
#: A resize must shorten the job's remaining time by at least this share.
MIN_GAIN = 0.01
#: Engine passes a list-scheduling search may spend: RUNS / (jobs x sqrt(GPUs)), about
#: what a pass costs, so about 1,000 passes (2 s) for 50 jobs on 64 GPUs; at least MIN_RUNS.
#: Up to SWEEP_SHARE of them go to the sweep of targets and families, the rest to local
#: searches from the best starts, as many as get DESCENT_RUNS passes each (at least one).
RUNS = 400_000
MIN_RUNS = 12
SWEEP_SHARE = 0.5
DESCENT_RUNS = 120
#: (start on what is free, grow only to hull counts) variants tried per target.
MODES = ((False, False), (True, False), (False, True), (True, True))
#: The variants tried with `mix`.
MIX_MODES = ((False, False), (False, True))
#: (order, deadline, mix, wide last, patient) families of list schedules (module docstring, step 3);
#: the best start of each family may get a local search.
FAMILIES = (("lpt", False, False, False, False), ("lpt", True, True, False, False), ("lpt", True, False, False, False),
            ("stiff", True, False, False, False), ("stiff", True, True, False, False), ("lpt", True, True, True, False),
            ("lpt", True, True, False, True), ("stiff", True, False, False, True), ("lpt", True, True, True, True))
#: Node-packing targets, as multiples of T* (core/nodepack.py), and the targets each node's
#: list schedules try, as multiples of the node-packing target.
NODE_FACTORS = (1.0, 1.01, 1.04, 1.06)
NODE_SLACK = (1.0, 1.05, 1.1, 1.2)
#: Node list-schedule variants (held to the target, fit, mix); a query for a node plan that ends
#: by a time (column generation's checks) tries only the first NODE_QUICK.
NODE_MODES = ((True, False, True), (True, True, True), (True, False, False), (False, False, False))
NODE_QUICK = 2
#: Targets node packing by column generation tries (bisecting; NodePacker.pack with columns).
COLUMN_STEPS = 3
#: The families the sweep tries first at every main target.
LEAD = 2


@dataclass
class _Omru:
    targets: list[int]
    order: list[int]
    hulls: tuple[fluid.Hull, ...]
    deadline: float  # the target makespan, as a time
    fit: bool = False
    hull_only: bool = False
    mix: bool = False
    patient: bool = False
    loose: frozenset = frozenset()  # jobs that start on their target count whatever the deadline
    quantum_s: float | None = None
    then: dict = field(default_factory=dict)  # job -> its count after a wide first part

    def step(self, e: Engine) -> None:
        waiting = set(e.waiting())
        if waiting and e.free_count:
            self.order = [j for j in self.order if e.remaining[j] > 0 or j in e.running]
        for j in self.order if waiting else ():
            if e.free_count == 0:
                break
            if j not in waiting:
                continue
            window = self.deadline - e.now
            if j in self.loose:
                g = self.targets[j]
            else:
                g = self.then.get(j) or max(self.targets[j], self._within(e, j, window))
            if self.mix and j not in self.then and j not in self.loose and g <= e.free_count:
                x, rest = self._wide_epochs(e, j, g, window)
                if x:
                    e.start(j, g, x)
                    self.then[j] = rest
                    continue
            if g <= e.free_count or (self.fit and 2 * e.free_count >= g):
                e.start(j, min(g, e.free_count))
                self.then.pop(j, None)
        if e.free_count and not (waiting and e.waiting()):
            self._grow(e)

    def _wide_epochs(self, e: Engine, j: int, g: int, window: float) -> tuple[int, int]:
        """(epochs on g GPUs, count after) for job j to end within `window` when the rest run on
        the next hull count below g after a restart (the fluid mix, whole epochs); (0, 0) if none."""
        counts = self.hulls[j].counts
        i = counts.index(g) if g in counts else 0
        if i == 0:
            return 0, 0
        x = wide_epochs(e.remaining[j], e.tau(j, counts[i - 1]), e.tau(j, g), window, e.problem.resize_cost_s)
        return (x, counts[i - 1]) if x else (0, 0)

    def _within(self, e: Engine, j: int, window: float) -> int:
        """Fewest GPUs on job j's hull that finish its remaining epochs within `window`."""
        counts = self.hulls[j].counts
        for c in counts:
            if e.remaining[j] * e.tau(j, c) <= window * (1 + 1e-12):
                return c
        # None does: the count that ends it first, given when running jobs release GPUs.
        frees = sorted((r.end, len(r.gpus)) for r in e.running.values())
        best, best_end = counts[0], float("inf")
        for c in counts:
            have, at = e.free_count, e.now
            for t, k in frees:
                if have >= c:
                    break
                have, at = have + k, t
            if have >= c and at + e.remaining[j] * e.tau(j, c) < best_end:
                best, best_end = c, at + e.remaining[j] * e.tau(j, c)
        return best

    def _grow(self, e: Engine) -> None:
        # The job that ends last first; growing one job does not move the others' ends.
        arrival = e.next_arrival() if self.patient else math.inf
        for end, j in sorted(((r.end, j) for j, r in e.running.items() if r.start <= e.now + EPS), reverse=True):
            if not e.free_count:
                return
            best, best_end = None, end - MIN_GAIN * (end - e.now)
            for c in self._wider(e, j, e.free_count):
                t = e.projected_end(j, c)
                if t < best_end:
                    best, best_end = c, t
            if best is None:
                continue
            if self.patient:  # growing when the next running job ends, onto its GPUs too, may pay more
                t1 = min((r.end for i, r in e.running.items() if i != j and e.now + EPS < r.end < end), default=math.inf)
                if t1 < arrival:
                    more = e.free_count + sum(len(r.gpus) for i, r in e.running.items() if i != j and r.end <= t1 + EPS)
                    if any(e.projected_end(j, c, t1) < best_end for c in self._wider(e, j, more)):
                        return  # the GPUs stay free for it
            e.resize(j, best)

    def _wider(self, e: Engine, j: int, free: int) -> list[int]:
        """Counts running job j may grow to with `free` more GPUs (up to its max_gpus)."""
        g = len(e.running[j].gpus)
        top = min(g + free, e.jobs[j].max_gpus)
        options = [c for c in self.hulls[j].counts if g < c <= top]
        return options if self.hull_only or top <= g else options + [top]


def _target(h: fluid.Hull, T: float) -> int:
    """Fewest GPUs on the hull that finish within T (the fastest count if none do)."""
    for c, t in zip(h.counts, h.times):
        if t <= T * (1 + 1e-12):
            return c
    return h.counts[-1]


def _breakpoints(sol: fluid.FluidSolution) -> list[float]:
    """Hull breakpoints in [T*, 2 T*] (when few enough): where some job's target count changes."""
    near = sorted({t for h in sol.hulls for t in h.times if sol.T <= t <= 2 * sol.T})
    return near if len(near) <= EXHAUSTIVE_BREAKPOINTS else []


def plan_with(problem: PlanningInput, start_s: float = 0.0, committed=()) -> Plan:
    """The `omru` plan, optionally continuing from `committed` segments at `start_s`."""
    tolerance = problem.options.get("makespan_tolerance", 0.0)
    if not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise PlanningError(f"omru: makespan_tolerance must be a share in [0, 1), got {tolerance!r}")
    deadline = problem.options.get("deadline_s")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                 or not deadline > 0):
        raise PlanningError(f"omru: deadline_s must be seconds > 0, got {deadline!r}")
    stop_at = math.inf if deadline is None else time.monotonic() + deadline

    def expired() -> bool:
        return time.monotonic() > stop_at

    D = fluid.durations(problem)
    sol = fluid.solve(problem, D)
    small = len(problem.jobs) * problem.cluster.gpus <= LIST_MAX
    plans = [_packed(problem, sol, start_s, committed, (False, True) if small else (False,), expired)]
    if small and not expired():
        listed = _listed(problem, sol, start_s, committed, expired)
        grown = grow_tail(problem, listed[0].segments, _busy(problem, start_s, committed), GROW_ROUNDS)
        plans.append(dataclasses.replace(listed[0], segments=tuple(grown)))
        if tolerance:
            plans += listed[1:]
    if small and problem.cluster.nodes > 1 and not start_s and not committed and not expired():
        plans += _node_packed(problem, sol, D, min((p.makespan_s for p in plans if not p.unplaced), default=math.inf),
                              expired)
    best = min(plans, key=_score)
    if tolerance and not best.unplaced:  # makespans this close count as equal
        near = [p for p in plans if not p.unplaced and p.makespan_s <= best.makespan_s * (1 + tolerance)]
        best = min(near, key=lambda p: _score(p)[1:])
    return best


def _node_packed(problem: PlanningInput, sol: fluid.FluidSolution, D, best_s: float, expired=lambda: False
                 ) -> list[Plan]:
    """Node packings (core/nodepack.py): greedy for targets f T*, f in NODE_FACTORS, while the
    best plan so far (`best_s`, or a node packing that ends earlier) misses them, then by
    column generation for COLUMN_STEPS targets halving the gap between the largest one it
    missed (at first T*) and the best plan so far (2 T* at most). D: fluid.durations."""
    packer = NodePacker(problem, D, _node_schedule)
    busy = [0.0] * problem.cluster.gpus
    plans: list[Plan] = []
    lo, hi = sol.T, min(best_s, 2 * sol.T)  # hi: the best plan so far

    def attempt(T: float, columns: bool) -> bool:
        nonlocal hi
        segments = packer.pack(T, columns)
        if segments is not None:
            plans.append(Plan("omru", tuple(grow_tail(problem, segments, busy, GROW_ROUNDS))))
            hi = min(hi, plans[-1].makespan_s)
        return segments is not None

    for f in NODE_FACTORS:
        if f * sol.T >= hi or expired():
            break  # a target the best plan meets
        attempt(f * sol.T, False)
    for _ in range(COLUMN_STEPS):
        if hi <= lo * (1 + PACK_MISS) or expired():
            break
        T = (lo + hi) / 2
        if not attempt(T, True):
            lo = T
    return plans


def _node_schedule(sub: PlanningInput, hulls: tuple[fluid.Hull, ...], T: float, start: float = 0.0,
                   after: dict | None = None, by: float | None = None) -> tuple | None:
    """The best of a few list schedules of one node's jobs from `start` (longest first at targets
    T and somewhat above, or at T with each job as wide as a squeeze of GPU-seconds allows; with
    and without the mix, fit and deadline), or with `by` the first of the quick ones that ends by
    then; jobs in `after` start once their wide part elsewhere ends, with a restart. None if
    none places them all."""
    # A wide part is history on no GPU of this node: the engine holds the job until it ends.
    before = [Segment(sub.jobs[i].id, 0.0, t, (), 1) for i, t in (after or {}).items()]
    best = None
    for f, squeeze in [(f, None) for f in NODE_SLACK] + [(1.0, sq) for sq in SQUEEZES]:
        targets = [_target(h, f * T - start) for h in hulls]
        if squeeze is not None:
            targets = [h.counts[_widest(h, h.counts.index(c), squeeze)] for h, c in zip(hulls, targets)]
        order = sorted(range(len(hulls)), key=lambda j: (-sub.jobs[j].duration(targets[j]), j))
        for held, fit, mix in NODE_MODES[:NODE_QUICK if by is not None else None]:
            policy = _Omru(list(targets), list(order), hulls, f * T if held else math.inf, fit, False, mix)
            plan = Engine(sub, policy, start_s=start, committed=before).run("omru")
            if not plan.unplaced and (best is None or plan.makespan_s < best.makespan_s):
                best = plan
                if by is not None and best.makespan_s <= by:
                    return best.segments
    return None if best is None else best.segments


def _widest(h: fluid.Hull, i: int, squeeze: float) -> int:
    """The widest of hull h's counts from its i-th on whose GPU-seconds exceed the i-th's by at
    most `squeeze`, as an index (a job that would leave GPUs idle runs wide and ends early)."""
    return max(k for k in range(i, len(h.counts)) if h.areas[k] <= h.areas[i] * (1 + squeeze))


def _score(plan: Plan) -> tuple[float, int, float]:
    """Least makespan (to the millisecond), then fewest resizes, then the jobs' completion times."""
    if plan.unplaced:
        return (float("inf"), 0, 0.0)
    ends: dict[str, float] = {}
    for s in plan.segments:
        ends[s.job] = max(ends.get(s.job, 0.0), s.end_s)
    return (round(plan.makespan_s, 3), resizes(plan), sum(ends.values()))


def _busy(problem: PlanningInput, start_s: float, committed) -> list[float]:
    """When each GPU is free of the committed segments."""
    busy = [start_s] * problem.cluster.gpus
    for s in committed:
        for g in s.gpus:
            busy[g] = max(busy[g], s.end_s)
    return busy


def _packed(problem: PlanningInput, sol: fluid.FluidSolution, start_s: float, committed,
            narrow_first: tuple[bool, ...] = (False,), expired=lambda: False) -> Plan:
    """The best packing over targets f T* (module docstring, step 2), for each
    `Packer.narrow_first` preference given."""
    index = {j.id: i for i, j in enumerate(problem.jobs)}
    busy = _busy(problem, start_s, committed)
    history: dict[int, tuple[tuple[int, ...], float]] = {}
    not_before = [max(start_s, j.arrival_s) for j in problem.jobs]
    for s in committed:
        i = index.get(s.job)
        if i is not None and (i not in history or s.end_s >= history[i][1]):
            history[i] = (tuple(s.gpus), s.end_s)
            not_before[i] = max(not_before[i], s.end_s)
    packer = Packer(problem, start_s, busy, not_before, history)
    plans = []
    for narrow in narrow_first:
        if plans and expired():
            break
        plans.append(_targets(problem, sol, start_s, packer, narrow, busy, expired))
    return min(plans, key=_score)


def _targets(problem: PlanningInput, sol: fluid.FluidSolution, start_s: float, packer: Packer, narrow: bool,
             busy: list[float], expired=lambda: False) -> Plan:
    packer.narrow_first = narrow
    best, below = None, 0.0

    def attempt(f: float) -> None:
        nonlocal best, below
        grid, items = packer.pack(f * sol.T, PACK_ROUNDS)
        segments = grow_tail(problem, packer.segments(grid, items), busy, GROW_ROUNDS)
        plan = Plan("omru", tuple(segments))
        if best is None or _score(plan) < _score(best):
            best = plan
        if plan.makespan_s > start_s + f * sol.T * (1 + PACK_MISS):
            below = max(below, f)  # this target was missed

    for f in PACK_FACTORS:
        if best is not None and (start_s + f * sol.T >= best.makespan_s or expired()):
            break
        attempt(f)
    # Halve the gap between the largest missed target and the best plan, twice.
    for _ in range(2 if below else 0):
        f = 0.5 * (below + (best.makespan_s - start_s) / sol.T)
        if f - below < PACK_MISS or expired():
            break
        attempt(f)
    return best


def _listed(problem: PlanningInput, sol: fluid.FluidSolution, start_s: float, committed,
            expired=lambda: False) -> list[Plan]:
    """Every list schedule tried (module docstring, step 3), the best first."""
    n = len(problem.jobs)
    tried: dict[tuple, tuple[tuple[float, int, float], Plan]] = {}

    def lpt(targets: tuple[int, ...]) -> tuple[int, ...]:
        dur = [problem.jobs[j].duration(targets[j]) for j in range(n)]
        return tuple(sorted(range(n), key=lambda j: (-dur[j], problem.jobs[j].arrival_s, j)))

    def attempt(targets: tuple[int, ...], order: tuple[int, ...], mode: tuple,
                loose: frozenset = frozenset()) -> tuple:
        key = (targets, order, mode, loose)  # mode: (deadline, fit, hull_only, mix, patient)
        if key not in tried:
            plan = Engine(problem, _Omru(list(targets), list(order), sol.hulls, *mode, loose), start_s=start_s,
                          committed=committed).run("omru")
            tried[key] = (_score(plan), plan)
        return tried[key][0]

    # Orders: longest first at the target counts, and least compressible first (by the time
    # at the widest hull count within a squeeze of the least area).
    stiff = []
    for sq in SQUEEZES:
        least = [h.times[_widest(h, 0, sq)] for h in sol.hulls]
        order = tuple(sorted(range(n), key=lambda j: (-least[j], problem.jobs[j].arrival_s, j)))
        if order not in stiff:
            stiff.append(order)
    budget = max(MIN_RUNS, int(RUNS / (n * problem.cluster.gpus ** 0.5)))
    starts: dict[tuple, tuple] = {}  # family -> its best (targets, order, mode, loose)
    for T, (kind, deadline, mix, wide_last, patient), variant in _sweep(sol):
        if len(tried) >= budget * SWEEP_SHARE or (tried and expired()):
            break
        targets = tuple(_target(h, T) for h in sol.hulls)
        loose = frozenset()
        if wide_last:
            mixes = [h.mix(T) for h in sol.hulls]
            loose = frozenset(j for j, m in enumerate(mixes) if len(m) > 1 and 2 * m[1][0] > problem.cluster.gpus)
            if not loose:
                continue
            targets = tuple(mixes[j][0][0] if j in loose else c for j, c in enumerate(targets))
        for k, order in enumerate([lpt(targets)] if kind == "lpt" else stiff):
            mode = (start_s + T if deadline else math.inf,) + variant + (mix, patient)
            key = (targets, order, mode, loose)
            attempt(*key)
            family = (kind, k, deadline, mix, wide_last, patient)
            if family not in starts or tried[key][0] < tried[starts[family]][0]:
                starts[family] = key
    # Local search from the best starts of the families, the best first, sharing what is left.
    descents = max(1, (budget - len(tried)) // DESCENT_RUNS)
    best_first = sorted(starts.values(), key=lambda key: tried[key][0])[:descents]
    for i, key in enumerate(best_first):
        _descend(problem, sol, tried, attempt, key, (budget - len(tried)) // (len(best_first) - i), expired)
    return [plan for _, plan in sorted(tried.values(), key=lambda v: v[0])]


def _sweep(sol: fluid.FluidSolution):
    """(target makespan, family, variant) to try, most promising first: the main targets with
    the first variant of the first LEAD families, of the others, the other variants, then the
    hull breakpoints with everything."""
    main = [sol.T * f for f in FACTORS]
    more = [T for T in _breakpoints(sol) if T not in main]
    passes = ((main, FAMILIES[:LEAD], slice(0, 1)), (main, FAMILIES[LEAD:], slice(0, 1)),
              (main, FAMILIES, slice(1, None)), (more, FAMILIES, slice(0, None)))
    for Ts, families, variants in passes:
        for T in Ts:
            for family in families:
                for variant in (MIX_MODES if family[2] else MODES)[variants]:
                    yield T, family, variant


def _descend(problem: PlanningInput, sol: fluid.FluidSolution, tried: dict, attempt, key: tuple,
             budget: int, expired=lambda: False) -> None:
    """Local search from `key` (targets, order, mode, loose): for the jobs that end last first,
    the job moved up the order (to the front, halfway there or one place), or its count changed,
    held to the deadline or not; the first move that scores better is taken."""
    n = len(problem.jobs)
    targets, order, mode, loose = key
    score, plan = tried[key]
    improved = True
    while improved and budget > 0:
        improved = False
        ends = {s.job: s.end_s for s in plan.segments}
        late = sorted(range(n), key=lambda j: (-ends.get(problem.jobs[j].id, 0.0), j))
        where = {j: i for i, j in enumerate(order)}
        moves = itertools.chain.from_iterable(itertools.chain(
            ((targets, _move(order, where[j], k), loose) for k in sorted({0, where[j] // 2, where[j] - 1}) if k < where[j]),
            ((targets[:j] + (c,) + targets[j + 1:], order, free) for free in (loose, loose ^ {j})
             for c in sol.hulls[j].counts if c != targets[j] or free != loose)) for j in late)
        for cand in moves:
            if budget <= 0 or expired():
                budget = 0
                break
            budget -= 1
            s = attempt(*cand[:2], mode, cand[2])
            if s < score:
                score, (targets, order, loose), improved = s, cand, True
                plan = tried[(targets, order, mode, loose)][1]
                break


def _move(order: tuple[int, ...], i: int, k: int) -> tuple[int, ...]:
    """`order` with its i-th job moved to place k."""
    rest = order[:i] + order[i + 1:]
    return rest[:k] + (order[i],) + rest[k:]


@register("omru", options=("deadline_s", "makespan_tolerance"))
def omru(problem: PlanningInput) -> Plan:
    """Fluid-guided packing or list scheduling, whichever ends first (see module docstring)."""
    committed = problem.options.get("committed", ())
    start_s = problem.options.get("start_s", 0.0)
    if not isinstance(start_s, (int, float)) or start_s < 0:
        raise PlanningError(f"omru: start_s must be a time >= 0, got {start_s!r}")
    return plan_with(problem, float(start_s), committed)
