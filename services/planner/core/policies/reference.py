"""The published OMRU algorithm and the baselines from the same code.

Faithful to the reference (see docs: the OMRU algorithm): a chromosome gives
each job an order label; jobs with one label form a group; groups run in label
order as batches; spare GPUs go one at a time to the slowest job of a group;
with reuse, idle slices of a batch host whole epochs of the next batch's jobs.
Only the GPU ids are ours (placement.py), the reference leaves them implicit,
and so are the caps for jobs profiled up to fewer GPUs than the cluster has
(the reference's profiles cover 1..G; on those nothing changes): no job gets
more than its largest profiled count (spare GPUs it cannot take go to the
others, or stay idle), and no slice hosts a guest that cannot use its GPUs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from services.planner.core import placement
from services.planner.core.model import Plan, PlanningError, PlanningInput, Segment
from services.planner.core.registry import register


@dataclass
class _Slice:
    job: int
    gpus: int
    epochs: int
    guest: int = -1  # job index hosted in this slice's idle time (reuse), -1 if none
    guest_epochs: int = 0


class _Tables:
    """t[j][g], E[j] and cap[j] (the most GPUs job j may get) as plain lists: the decoder runs
    50,000 times per plan."""

    def __init__(self, problem: PlanningInput) -> None:
        self.G = problem.cluster.gpus
        self.n = len(problem.jobs)
        self.E = [j.epochs for j in problem.jobs]
        self.t = [[0.0] + j.table(self.G) for j in problem.jobs]
        self.cap = [min(j.max_gpus, self.G) for j in problem.jobs]

    def length(self, s: _Slice) -> float:
        """The slice's own work (without a hosted guest)."""
        return s.epochs * self.t[s.job][s.gpus]


def _grow(tab: _Tables, jobs: list[int], spare: int) -> list[int]:
    """Hand out `spare` GPUs one at a time to the job with the largest
    current completion time E_j * t_j(g_j) among those below their cap;
    first in order wins ties. GPUs no job can take stay idle."""
    g = [1] * len(jobs)
    for _ in range(spare):
        best, best_c = -1, -1.0
        for i, j in enumerate(jobs):
            c = tab.E[j] * tab.t[j][g[i]]
            if c > best_c and g[i] < tab.cap[j]:
                best, best_c = i, c
        if best < 0:
            break
        g[best] += 1
    return g


def _batches(tab: _Tables, labels: tuple[int, ...]) -> list[list[_Slice]]:
    """Steps 1-3 of the decoder: groups by label, spare GPUs, chunks of G."""
    G = tab.G
    order = sorted(range(tab.n), key=lambda j: (labels[j], tab.E[j] * tab.t[j][1]))
    batches: list[list[_Slice]] = []
    i = 0
    while i < len(order):
        k = i
        while k < len(order) and labels[order[k]] == labels[order[i]]:
            k += 1
        group = order[i:k]
        i = k
        if len(group) < G:
            gpus = _grow(tab, group, G - len(group))
            batches.append([_Slice(j, g, tab.E[j]) for j, g in zip(group, gpus)])
        else:
            for c in range(0, len(group), G):
                batches.append([_Slice(j, 1, tab.E[j]) for j in group[c : c + G]])
    return batches


def _reuse(tab: _Tables, batches: list[list[_Slice]]) -> None:
    """Step 4: idle slices of batch b host whole epochs of batch b+1's jobs."""
    for b in range(len(batches) - 1):
        cur, nxt = batches[b], batches[b + 1]
        L = max(tab.length(s) for s in cur)
        idle = [(L - tab.length(s), s) for s in cur if L - tab.length(s) > 0]
        idle.sort(key=lambda p: -p[0])
        later = sorted(nxt, key=lambda s: -tab.length(s))
        for (r, host), guest in zip(idle, later):
            e = min(math.floor(r / tab.t[guest.job][host.gpus]), guest.epochs)
            if e > 0 and host.gpus <= tab.cap[guest.job]:
                host.guest, host.guest_epochs = guest.job, e
                guest.epochs -= e


def _makespan(tab: _Tables, batches: list[list[_Slice]]) -> float:
    return sum(max(tab.length(s) for s in batch) for batch in batches)


def decode(tab: _Tables, labels: tuple[int, ...], reuse: bool) -> tuple[float, list[list[_Slice]]]:
    batches = _batches(tab, labels)
    if reuse:
        _reuse(tab, batches)
    return _makespan(tab, batches), batches


def reference_utilization(tab: _Tables, batches: list[list[_Slice]]) -> float:
    """The reference code's U: idle is counted only inside the slices of a
    batch, so GPUs a final short chunk leaves empty are not idle (the quirk)."""
    T = _makespan(tab, batches)
    idle = 0.0
    for batch in batches:
        L = max(tab.length(s) for s in batch)
        for s in batch:
            busy = tab.length(s)
            if s.guest >= 0:
                busy += s.guest_epochs * tab.t[s.guest][s.gpus]
            idle += (L - busy) * s.gpus
    return (tab.G * T - idle) / (tab.G * T)


def _to_plan(name: str, problem: PlanningInput, tab: _Tables, batches: list[list[_Slice]]) -> Plan:
    ids = [j.id for j in problem.jobs]
    segments: list[Segment] = []
    start = 0.0
    for batch in batches:
        L = max(tab.length(s) for s in batch)
        gpu_sets = placement.assign(problem.cluster, [s.gpus for s in batch])
        for s, gpus in zip(batch, gpu_sets):
            own = tab.length(s)
            if s.epochs > 0:
                segments.append(Segment(ids[s.job], start, start + own, gpus, s.epochs))
            if s.guest >= 0:
                extra = s.guest_epochs * tab.t[s.guest][s.gpus]
                segments.append(Segment(ids[s.guest], start + own, start + own + extra, gpus, s.guest_epochs))
        start += L
    return Plan(name, tuple(segments), reference_utilization(tab, batches))


# ---------------------------------------------------------------- baselines


@register("sequential")
def sequential(problem: PlanningInput) -> Plan:
    """Jobs one after another, each on all G GPUs (or as many as it can use)."""
    tab = _Tables(problem)
    batches = [[_Slice(j, tab.cap[j], tab.E[j])] for j in range(tab.n)]
    return _to_plan("sequential", problem, tab, batches)


def _list_schedule(name: str, problem: PlanningInput, tab: _Tables, order: list[int]) -> Plan:
    """Each job in `order` on 1 GPU, to the least-loaded GPU (lowest id on ties)."""
    load = [0.0] * tab.G
    segments = []
    for j in order:
        gpu = min(range(tab.G), key=lambda g: (load[g], g))
        d = tab.E[j] * tab.t[j][1]
        segments.append(Segment(problem.jobs[j].id, load[gpu], load[gpu] + d, (gpu,), tab.E[j]))
        load[gpu] += d
    T = max(load)
    return Plan(name, tuple(segments), sum(load) / (tab.G * T))


@register("parallel")
def parallel(problem: PlanningInput) -> Plan:
    """All jobs at once (the authors' "Themis"): if G > n, spare GPUs go to the
    slowest job one by one; else longest-first list scheduling on 1 GPU each."""
    tab = _Tables(problem)
    jobs = list(range(tab.n))
    if tab.G > tab.n:
        batch = [_Slice(j, g, tab.E[j]) for j, g in zip(jobs, _grow(tab, jobs, tab.G - tab.n))]
        return _to_plan("parallel", problem, tab, [batch])
    order = sorted(jobs, key=lambda j: -tab.E[j] * tab.t[j][1])
    return _list_schedule("parallel", problem, tab, order)


@register("optimus")
def optimus(problem: PlanningInput) -> Plan:
    """Optimus-style: if G >= n, each spare GPU goes to the job with the largest
    gain per GPU held, (D(g) - D(g+1)) / g; else shortest-first list scheduling."""
    tab = _Tables(problem)
    jobs = list(range(tab.n))
    if tab.G >= tab.n:
        g = [1] * tab.n
        for _ in range(tab.G - tab.n):
            best, best_gain = -1, -math.inf
            for j in jobs:
                if g[j] < tab.cap[j]:
                    gain = tab.E[j] * (tab.t[j][g[j]] - tab.t[j][g[j] + 1]) / g[j]
                    if gain > best_gain:
                        best, best_gain = j, gain
            if best < 0:
                break  # every job at its cap: the rest stay idle
            g[best] += 1
        batch = [_Slice(j, g[j], tab.E[j]) for j in jobs]
        return _to_plan("optimus", problem, tab, [batch])
    order = sorted(jobs, key=lambda j: tab.E[j] * tab.t[j][1])
    return _list_schedule("optimus", problem, tab, order)


# ---------------------------------------------------------------- the GA


def genetic_search(
    tab: _Tables, reuse: bool, population: int, generations: int, seed: int
) -> tuple[int, ...]:
    """The reference GA over order labels; returns the best chromosome.

    Roulette-wheel selection on 1/T (N draws with replacement), shuffle and
    pair, one-point crossover at a cut in 1..n-1, one-gene mutation of every
    child to a different label, keep the best N of parents and children.
    """
    n, rng = tab.n, random.Random(seed)
    cache: dict[tuple[int, ...], float] = {}

    def T(c: tuple[int, ...]) -> float:
        v = cache.get(c)
        if v is None:
            v = cache[c] = decode(tab, c, reuse)[0]
        return v

    pop = [tuple(rng.randint(1, n) for _ in range(n)) for _ in range(population)]
    if n == 1:
        return pop[0]
    labels = range(1, n + 1)
    for _ in range(generations):
        weights = [1.0 / T(c) for c in pop]
        parents = rng.choices(pop, weights=weights, k=population)
        rng.shuffle(parents)
        children: list[tuple[int, ...]] = []
        for i in range(0, population - 1, 2):
            a, b = parents[i], parents[i + 1]
            cut = rng.randint(1, n - 1)
            children += [a[:cut] + b[cut:], b[:cut] + a[cut:]]
        if population % 2:
            children.append(parents[-1])
        mutated = []
        for c in children:
            pos = rng.randrange(n)
            new = rng.choice([label for label in labels if label != c[pos]])
            mutated.append(c[:pos] + (new,) + c[pos + 1 :])
        pop = sorted(pop + mutated, key=T)[:population]
    return pop[0]


def _ga_policy(name: str, reuse: bool):
    def policy(problem: PlanningInput) -> Plan:
        opts = problem.options
        population, generations = opts.get("population", 50), opts.get("generations", 1000)
        if not (isinstance(population, int) and population >= 2):
            raise PlanningError(f"{name}: population must be an integer >= 2, got {population!r}")
        if not (isinstance(generations, int) and generations >= 0):
            raise PlanningError(f"{name}: generations must be an integer >= 0, got {generations!r}")
        tab = _Tables(problem)
        best = genetic_search(tab, reuse, population=population, generations=generations, seed=problem.seed)
        return _to_plan(name, problem, tab, decode(tab, best, reuse)[1])

    policy.__name__ = name.replace("-", "_")
    policy.__doc__ = (f"The OMRU genetic search, {'with' if reuse else 'without'} idle-slice reuse; options "
                      "population (default 50) and generations (default 1000).")
    return register(name, options=("generations", "population"))(policy)


omru_ga = _ga_policy("omru-ga", reuse=True)
omru_noreuse = _ga_policy("omru-noreuse", reuse=False)
