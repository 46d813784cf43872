"""The planner's data model: frozen dataclasses, no I/O.

A job runs `epochs` epochs; its profile gives seconds per epoch by GPU count,
measured at some counts: its largest is the most GPUs the job can use
(`Job.max_gpus`, whatever the cluster's size; no plan gives it more, the
validator checks), and the counts below it not measured are timed by one rule
(`filled`): the time of the nearest measured count below (no speed-up is
assumed that was not measured), or below the smallest measured count, that
one's time scaled ideally. The cluster is `nodes` x `gpus_per_node` identical
GPUs; GPU id g lies on node g // gpus_per_node. A plan is a list of segments:
job runs `epochs` whole epochs on exactly `gpus` during [start_s, end_s).

Room for what comes after the paper's batch setting (unused by the reference
policies, checked by the validator where it applies): a job's `arrival_s`
(no segment starts before it), its `requested_gpus` (for rigid baselines),
`placement` epoch times keyed by (GPU count, nodes spanned), and the input's
`resize_cost_s` (the price of changing a running job's GPU set).

A spread the placement table does not give is timed by one conservative rule
(`Job.epoch_seconds`), which every policy and the validator share: the
slowest time measured for that GPU count over fewer nodes (the profile's
time counts as the tightest placement). A spread is never assumed faster than
a tighter one measured, and one wider than any measured costs at least the
slowest measured.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence


class PlanningError(ValueError):
    """Input the planner cannot work with; the message names the bad value."""


def filled(profile: Mapping[int, float], counts: Sequence[int], gpus: int) -> float:
    """Seconds per epoch on `gpus` GPUs from a measured profile whose counts, ascending, are `counts`.

    The one rule for a count not measured (the planner service's too): the time
    of the nearest measured count below it (no speed-up is assumed that was not
    measured; above the largest, the largest's time), and below the smallest
    measured count k, t(k) k / gpus (ideal scaling).
    """
    below = bisect_right(counts, gpus)
    return profile[counts[below - 1]] if below else profile[counts[0]] * counts[0] / gpus


def epoch_table(profile: Mapping[int, float], gpus: int) -> dict[int, float]:
    """Seconds per epoch on every count 1..gpus from a measured profile, complete or not (`filled`)."""
    counts = sorted(profile)
    if not counts:
        raise PlanningError("the profile gives no epoch time for any GPU count")
    return {g: filled(profile, counts, g) for g in range(1, gpus + 1)}


@dataclass(frozen=True)
class Job:
    """One training job: `epochs` epochs, `profile[g]` seconds per epoch on g GPUs as measured.

    The profile may be partial: its largest count is the most GPUs the job may
    run on (`max_gpus`), and `epoch_seconds` times the counts below it that it
    does not give (`filled`).
    """

    id: str
    epochs: int
    profile: Mapping[int, float]
    arrival_s: float = 0.0
    requested_gpus: int | None = None
    placement: Mapping[tuple[int, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id:
            raise PlanningError("job id must not be empty")
        if not isinstance(self.epochs, int) or self.epochs <= 0:
            raise PlanningError(f"job {self.id!r}: epochs must be a positive integer, got {self.epochs!r}")
        if not self.profile:
            raise PlanningError(f"job {self.id!r}: the profile gives no epoch time for any GPU count")
        for g, t in self.profile.items():
            if not isinstance(g, int) or g <= 0:
                raise PlanningError(f"job {self.id!r}: GPU count must be a positive integer, got {g!r}")
            if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
                raise PlanningError(f"job {self.id!r}: epoch time on {g} GPUs must be positive, got {t!r}")
        if not (isinstance(self.arrival_s, (int, float)) and math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise PlanningError(f"job {self.id!r}: arrival_s must be >= 0, got {self.arrival_s!r}")
        if self.requested_gpus is not None and not (
            isinstance(self.requested_gpus, int) and self.requested_gpus > 0
        ):
            raise PlanningError(f"job {self.id!r}: requested_gpus must be a positive integer, got {self.requested_gpus!r}")
        for key, t in self.placement.items():
            if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(v, int) and v > 0 for v in key)
                    and key[1] <= key[0]):
                raise PlanningError(f"job {self.id!r}: placement key must be (gpus, nodes <= gpus), got {key!r}")
            if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
                raise PlanningError(f"job {self.id!r}: epoch time on {key[0]} GPUs over {key[1]} nodes must be positive, got {t!r}")
        object.__setattr__(self, "profile", MappingProxyType(dict(sorted(self.profile.items()))))
        object.__setattr__(self, "_counts", tuple(self.profile))
        object.__setattr__(self, "placement", MappingProxyType(dict(sorted(self.placement.items()))))
        # per GPU count with measured spreads: (nodes ascending, the slowest time up to each)
        spreads: dict[int, tuple[list[int], list[float]]] = {}
        for (g, k), t in self.placement.items():
            ks, slowest = spreads.setdefault(g, ([], []))
            ks.append(k)
            slowest.append(max(t, slowest[-1] if slowest else self.profile.get(g, t)))
        object.__setattr__(self, "_spreads", spreads)

    def __getstate__(self) -> dict:  # (pickled to a planning process: a mappingproxy is not picklable)
        return _unproxied(self)

    def __setstate__(self, state: dict) -> None:
        _reproxied(self, state)

    def epoch_seconds(self, gpus: int, nodes: int | None = None) -> float:
        """Seconds per epoch on `gpus` GPUs; spread over `nodes` nodes, the placement table's time, or for a
        spread it does not give, the slowest it gives for `gpus` over fewer nodes (or the profile's)."""
        if nodes is not None:
            t = self.placement.get((gpus, nodes))
            if t is not None:
                return t
            measured = self._spreads.get(gpus)
            if measured is not None:
                fewer = bisect_left(measured[0], nodes)
                if fewer:
                    return max(measured[1][fewer - 1], self.profile.get(gpus, 0.0))
        t = self.profile.get(gpus)
        if t is not None:
            return t
        if not 1 <= gpus <= self.max_gpus:
            raise PlanningError(
                f"job {self.id!r} runs on 1 to {self.max_gpus} GPUs (its largest profiled count), not {gpus!r}")
        return filled(self.profile, self._counts, gpus)

    def duration(self, gpus: int, nodes: int | None = None) -> float:
        """D_j(g): seconds for all epochs on `gpus` GPUs."""
        return self.epochs * self.epoch_seconds(gpus, nodes)

    @property
    def max_gpus(self) -> int:
        """The largest profiled count: the most GPUs the job may run on."""
        return self._counts[-1]

    def table(self, gpus: int) -> list[float]:
        """Seconds per epoch on 1..gpus GPUs (index g-1), on counts above `max_gpus` its time there: they
        are never faster and cost more GPU-seconds, so no bound or plan of least time or GPU-seconds
        takes them (and no plan may: policies cap a job's GPUs at `max_gpus`)."""
        m = min(gpus, self.max_gpus)
        if self._counts[m - 1:m] == (m,):  # (measured at every count 1..m)
            times = list(itertools.islice(self.profile.values(), m))
        else:
            times = [filled(self.profile, self._counts, g) for g in range(1, m + 1)]
        return times + [self.profile[self.max_gpus]] * (gpus - m)


@dataclass(frozen=True)
class Cluster:
    """`nodes` nodes of `gpus_per_node` GPUs each; GPU ids 0..total-1.

    `hosts` (optional, one per node) names the machine each node lies on, for clusters whose machines
    differ in size (`of_sizes`): they are planned as nodes of the greatest common divisor of their
    sizes, a machine of 8 GPUs beside ones of 4 as two nodes of 4 on one host. Policies pack by node;
    spreads are timed by the machines they span (`nodes_spanned`), so no plan is timed as if a job
    crossed machines it does not cross, nor the reverse.
    """

    nodes: int
    gpus_per_node: int
    hosts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or self.nodes <= 0:
            raise PlanningError(f"nodes must be a positive integer, got {self.nodes!r}")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node <= 0:
            raise PlanningError(f"gpus_per_node must be a positive integer, got {self.gpus_per_node!r}")
        if self.hosts and len(self.hosts) != self.nodes:
            raise PlanningError(f"hosts names {len(self.hosts)} nodes, the cluster has {self.nodes}")

    @classmethod
    def of(cls, gpus: int, gpus_per_node: int | None = None) -> "Cluster":
        """A cluster of `gpus` GPUs, `gpus_per_node` per node (default: one node)."""
        per = gpus if gpus_per_node is None else gpus_per_node
        if not isinstance(gpus, int) or gpus <= 0:
            raise PlanningError(f"gpus must be a positive integer, got {gpus!r}")
        if not isinstance(per, int) or per <= 0:
            raise PlanningError(f"gpus per node must be a positive integer, got {per!r}")
        if gpus % per:
            raise PlanningError(f"gpus ({gpus}) is not a multiple of gpus per node ({per})")
        return cls(nodes=gpus // per, gpus_per_node=per)

    @classmethod
    def of_sizes(cls, sizes: Sequence[int]) -> "Cluster":
        """Machines of these GPU counts, in order (GPU ids run through each machine's in turn)."""
        if not sizes or any(not isinstance(n, int) or n <= 0 for n in sizes):
            raise PlanningError(f"machine sizes must be positive integers, got {list(sizes)!r}")
        per = math.gcd(*sizes)
        if len(set(sizes)) == 1:
            return cls(nodes=len(sizes), gpus_per_node=per)
        return cls(nodes=sum(sizes) // per, gpus_per_node=per,
                   hosts=tuple(h for h, n in enumerate(sizes) for _ in range(n // per)))

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def fewest_hosts(self, nodes: int) -> int:
        """The fewest machines `nodes` nodes can lie on (`nodes` itself when no `hosts` are named)."""
        if not self.hosts:
            return nodes
        sizes = sorted((self.hosts.count(h) for h in set(self.hosts)), reverse=True)
        covered = 0
        for k, n in enumerate(sizes, 1):
            covered += n
            if covered >= nodes:
                return k
        return len(sizes)

    def nodes_spanned(self, gpus) -> int:
        """How many machines the GPU ids `gpus` lie on."""
        if self.hosts:
            return len({self.hosts[g // self.gpus_per_node] for g in gpus})
        return len({g // self.gpus_per_node for g in gpus})


@dataclass(frozen=True)
class PlanningInput:
    """Everything a policy sees: the jobs, the cluster, and policy options.

    A job's profile need not reach the cluster's size: every policy gives a job at most its
    `max_gpus` GPUs, and reads its times over 1..G from `Job.table`.
    """

    jobs: tuple[Job, ...]
    cluster: Cluster
    seed: int = 0
    options: Mapping[str, object] = field(default_factory=dict)
    resize_cost_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", tuple(self.jobs))
        if not (isinstance(self.resize_cost_s, (int, float)) and math.isfinite(self.resize_cost_s)
                and self.resize_cost_s >= 0):
            raise PlanningError(f"resize cost must be >= 0 seconds, got {self.resize_cost_s!r}")
        if not self.jobs:
            raise PlanningError("no jobs to plan")
        seen: set[str] = set()
        for job in self.jobs:
            if job.id in seen:
                raise PlanningError(f"duplicate job id {job.id!r}")
            seen.add(job.id)
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def __getstate__(self) -> dict:
        return _unproxied(self)

    def __setstate__(self, state: dict) -> None:
        _reproxied(self, state)

    def job(self, job_id: str) -> Job:
        for job in self.jobs:
            if job.id == job_id:
                return job
        raise KeyError(job_id)


@dataclass(frozen=True)
class Segment:
    """Job `job` runs `epochs` epochs on exactly `gpus` during [start_s, end_s)."""

    job: str
    start_s: float
    end_s: float
    gpus: tuple[int, ...]
    epochs: int

    def to_dict(self) -> dict:
        return {
            "job": self.job,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "gpus": list(self.gpus),
            "epochs": self.epochs,
        }


@dataclass(frozen=True)
class Unplaced:
    """A job the policy could not place, and why: data in the result, not an exception."""

    job: str
    reason: str


@dataclass(frozen=True)
class Plan:
    """A schedule: segments, plus what the policy reports about itself.

    `reference_utilization` is the reference code's own formula (idle time
    counted only inside its batches, see policies/reference.py) where the
    policy has one, else None.
    """

    policy: str
    segments: tuple[Segment, ...]
    reference_utilization: float | None = None
    unplaced: tuple[Unplaced, ...] = ()

    @property
    def makespan_s(self) -> float:
        return max((s.end_s for s in self.segments), default=0.0)

    def busy_gpu_seconds(self, jobs: "PlanningInput") -> float:
        """GPU-seconds spent computing: epochs * t_j(g, nodes spanned) * g over segments."""
        total = 0.0
        for s in self.segments:
            g = len(s.gpus)
            nodes = jobs.cluster.nodes_spanned(s.gpus)
            total += s.epochs * jobs.job(s.job).epoch_seconds(g, nodes) * g
        return total

    def utilization(self, problem: "PlanningInput") -> float:
        """Honest utilisation: busy GPU-seconds / (G * makespan)."""
        T = self.makespan_s
        return self.busy_gpu_seconds(problem) / (problem.cluster.gpus * T) if T > 0 else 0.0


def _unproxied(obj) -> dict:
    """A frozen dataclass's fields, its read-only mappings as plain dicts (what pickle can copy)."""
    return {k: dict(v) if isinstance(v, MappingProxyType) else v for k, v in vars(obj).items()}


def _reproxied(obj, state: dict) -> None:
    """Restore `_unproxied` state, its mappings read-only again (no validation: it was validated)."""
    for k, v in state.items():
        object.__setattr__(obj, k, MappingProxyType(v) if isinstance(v, dict) else v)
