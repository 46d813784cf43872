"""What happened, from the executors' own events: makespan, utilisation, per job, Gantt.

Pure: events in (`Event`, converted from ``omru.v1.ExecutorEvent`` by
services/planner/convert.py), figures out. No grpc, no etcd.

Definitions (all times are Unix seconds; ``origin`` is the first submission):

- A *hold* is one attempt of one job on the GPUs of one node, from that
  node's STARTED event to its GPUS_RELEASED event (or FINISHED / FAILED when
  no release follows; still open at ``now`` while it runs). A held GPU is
  busy: process start, data loading, checkpointing and training all occupy it.
- actual makespan = last FINISHED - origin.
- utilisation = held GPU-seconds inside [origin, origin + makespan) /
  (GPUs x makespan). ``compute_utilisation`` counts only the epochs' own
  seconds (sum of epoch_seconds x world size over EPOCH_DONE), so the gap
  between the two is start, resize and checkpoint overhead.
- a *resize* is a new attempt of a job whose world size differs from its
  previous attempt's.
- `ownership_conflicts` replays the holds and lists every instant two
  different attempts held one GPU (empty = no GPU ever had two owners).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

STARTED, EPOCH_DONE, FINISHED, GPUS_RELEASED, FAILED = "started", "epoch_done", "finished", "gpus_released", "failed"
KINDS = (STARTED, EPOCH_DONE, FINISHED, GPUS_RELEASED, FAILED)

Gpu = tuple[str, int]  # (node_id, index)


@dataclass(frozen=True)
class Event:
    """One executor event (the fields of ExecutorEvent the report needs)."""

    node_id: str
    job_id: str
    kind: str
    time_s: float
    attempt_id: str = ""
    gpus: tuple[Gpu, ...] = ()
    world_size: int = 0
    epoch: int = 0
    epoch_seconds: float = 0.0
    accuracy: float = 0.0
    seq: int = 0
    message: str = ""  # FAILED: why

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"event kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "gpus", tuple((str(n), int(i)) for n, i in self.gpus))


@dataclass(frozen=True)
class Hold:
    """Attempt `attempt_id` of `job_id` held `gpus` (all on one node) during [start_s, end_s)."""

    job_id: str
    attempt_id: str
    node_id: str
    gpus: tuple[Gpu, ...]
    start_s: float
    end_s: float
    world_size: int


@dataclass(frozen=True)
class PlannedSegment:
    """A planned stretch: job on `gpus` during [start_s, end_s) after the plan's origin."""

    job_id: str
    start_s: float
    end_s: float
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class Resize:
    """Job `job_id` restarted at `time_s` (after origin) on `to_size` GPUs instead of `from_size`."""

    job_id: str
    time_s: float
    from_size: int
    to_size: int


@dataclass(frozen=True)
class JobFigures:
    job_id: str
    finished: bool
    epochs_done: int
    accuracy: float
    actual_finish_s: float  # after origin; 0 while unfinished
    planned_finish_s: float  # after origin; 0 when unknown
    gpu_seconds: float  # held
    world_sizes: tuple[int, ...]  # one per attempt, in order
    state: str = ""  # the job's state (JobState name without its prefix) where known
    message: str = ""  # why it failed (exit code and the failing rank's last stderr lines), where it did


@dataclass(frozen=True)
class Figures:
    makespan_s: float
    planned_makespan_s: float
    utilisation: float
    compute_utilisation: float
    gpus: int
    jobs: tuple[JobFigures, ...]
    resizes: tuple[Resize, ...]
    policy: str = ""
    lower_bound_s: float = 0.0

    @property
    def makespan_error(self) -> float:
        """(actual - planned) / planned; 0 when no plan is known."""
        if self.planned_makespan_s <= 0:
            return 0.0
        return (self.makespan_s - self.planned_makespan_s) / self.planned_makespan_s

    @property
    def all_finished(self) -> bool:
        return bool(self.jobs) and all(j.finished for j in self.jobs)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["makespan_error"] = self.makespan_error
        d["all_finished"] = self.all_finished
        return d


def holds(events: Iterable[Event], now_s: float | None = None) -> list[Hold]:
    """Every hold the events show, by start time (open holds end at `now_s`, else at their last event).

    Per node and job: STARTED opens a hold (closing the job's previous one on
    that node: a resize that keeps a GPU releases nothing); GPUS_RELEASED
    closes it; FINISHED / FAILED close it only when the attempt logs no
    release on that node.
    """
    evs = sorted(events, key=lambda e: (e.time_s, e.seq))
    released = {(e.node_id, e.job_id, e.attempt_id) for e in evs if e.kind == GPUS_RELEASED}
    open_: dict[tuple[str, str], tuple[Event, float]] = {}
    out: list[Hold] = []
    for e in evs:
        key = (e.node_id, e.job_id)
        if e.kind == STARTED:
            if key in open_ and open_[key][0].attempt_id == e.attempt_id:
                continue
            if key in open_:
                out.append(_hold(open_.pop(key)[0], e.time_s))
            open_[key] = (e, e.time_s)
        elif key in open_:
            start, _ = open_[key]
            closes = e.kind == GPUS_RELEASED or (
                e.kind in (FINISHED, FAILED) and (e.node_id, e.job_id, start.attempt_id) not in released)
            if closes:
                out.append(_hold(start, e.time_s))
                del open_[key]
            else:
                open_[key] = (start, e.time_s)
    for start, last in open_.values():
        out.append(_hold(start, last if now_s is None else max(now_s, last)))
    return sorted(out, key=lambda h: (h.start_s, h.node_id, h.gpus))


def _hold(start: Event, end_s: float) -> Hold:
    local = tuple(g for g in start.gpus if g[0] == start.node_id) or start.gpus
    return Hold(start.job_id, start.attempt_id, start.node_id, local, start.time_s, end_s,
                start.world_size or len(start.gpus))


def ownership_conflicts(all_holds: Sequence[Hold]) -> list[tuple[Gpu, Hold, Hold]]:
    """Pairs of holds by different attempts that overlap in time on one GPU."""
    by_gpu: dict[Gpu, list[Hold]] = {}
    for h in all_holds:
        for g in h.gpus:
            by_gpu.setdefault(g, []).append(h)
    conflicts = []
    for g, hs in sorted(by_gpu.items()):
        hs = sorted(hs, key=lambda h: h.start_s)
        for a, b in zip(hs, hs[1:]):
            if (a.job_id, a.attempt_id) != (b.job_id, b.attempt_id) and b.start_s < a.end_s:
                conflicts.append((g, a, b))
    return conflicts


def figures(events: Sequence[Event], gpus: int, origin_s: float, plan: Sequence[PlannedSegment] = (),
            plan_origin_s: float | None = None, policy: str = "", lower_bound_s: float = 0.0,
            now_s: float | None = None, jobs: Sequence[str] = ()) -> Figures:
    """The report's figures from executor events and (optionally) the first plan.

    `plan` segments are relative to `plan_origin_s` (default `origin_s`);
    planned finishes and makespan are shifted to be relative to `origin_s`.
    `jobs` names jobs to list even when no event or segment mentions them.
    """
    if gpus <= 0:
        raise ValueError(f"gpus must be positive, got {gpus}")
    evs = sorted(events, key=lambda e: (e.time_s, e.seq))
    finish: dict[str, float] = {}
    epochs: dict[str, set[int]] = {}
    accuracy: dict[str, float] = {}
    compute = 0.0
    job_ids: list[str] = list(jobs)
    for e in evs:
        if e.job_id not in job_ids:
            job_ids.append(e.job_id)
        if e.kind == EPOCH_DONE:
            epochs.setdefault(e.job_id, set()).add(e.epoch)
            accuracy[e.job_id] = e.accuracy
            # only the node of rank 0 reports an epoch: it counts for every rank
            compute += e.epoch_seconds * (e.world_size or 1)
        elif e.kind == FINISHED:
            finish[e.job_id] = max(finish.get(e.job_id, 0.0), e.time_s - origin_s)
    hs = holds(evs, now_s=now_s)
    end_s = max(finish.values(), default=0.0) if finish else ((now_s or 0.0) - origin_s)
    makespan = max(end_s, 0.0)
    held = sum(len(h.gpus) * max(0.0, min(h.end_s, origin_s + makespan) - max(h.start_s, origin_s)) for h in hs)
    shift = (plan_origin_s if plan_origin_s is not None else origin_s) - origin_s
    planned_finish: dict[str, float] = {}
    for s in plan:
        planned_finish[s.job_id] = max(planned_finish.get(s.job_id, 0.0), s.end_s + shift)
    for j in planned_finish:
        if j not in job_ids:
            job_ids.append(j)
    attempts = _attempts(hs)
    resizes = []
    for j, sizes in attempts.items():
        for (_, a_size), (t, b_size) in zip(sizes, sizes[1:]):
            if a_size != b_size:
                resizes.append(Resize(j, t - origin_s, a_size, b_size))
    per_job = tuple(
        JobFigures(
            job_id=j, finished=j in finish, epochs_done=len(epochs.get(j, ())), accuracy=accuracy.get(j, 0.0),
            actual_finish_s=finish.get(j, 0.0), planned_finish_s=planned_finish.get(j, 0.0),
            gpu_seconds=sum(len(h.gpus) * (h.end_s - h.start_s) for h in hs if h.job_id == j),
            world_sizes=tuple(size for _, size in attempts.get(j, [])))
        for j in sorted(job_ids))
    denom = gpus * makespan
    return Figures(
        makespan_s=makespan,
        planned_makespan_s=max(planned_finish.values(), default=0.0),
        utilisation=held / denom if denom > 0 else 0.0,
        compute_utilisation=compute / denom if denom > 0 else 0.0,
        gpus=gpus, jobs=per_job, resizes=tuple(sorted(resizes, key=lambda r: r.time_s)),
        policy=policy, lower_bound_s=lower_bound_s)


def _attempts(hs: Sequence[Hold]) -> dict[str, list[tuple[float, int]]]:
    """Per job, (first start, world size) of each attempt in start order."""
    first: dict[tuple[str, str], tuple[float, int]] = {}
    for h in hs:
        key = (h.job_id, h.attempt_id)
        if key not in first or h.start_s < first[key][0]:
            first[key] = (h.start_s, h.world_size)
    out: dict[str, list[tuple[float, int]]] = {}
    for (j, _), v in sorted(first.items(), key=lambda kv: kv[1][0]):
        out.setdefault(j, []).append(v)
    return out


def text(f: Figures) -> str:
    """The report as a few lines of text."""
    lines = [
        f"policy {f.policy or '?'} on {f.gpus} GPUs",
        f"makespan {f.makespan_s:.1f} s actual, {f.planned_makespan_s:.1f} s planned "
        f"({100 * f.makespan_error:+.1f} %)" + (f", lower bound {f.lower_bound_s:.1f} s" if f.lower_bound_s else ""),
        f"utilisation {100 * f.utilisation:.1f} % (GPUs held), {100 * f.compute_utilisation:.1f} % (in epochs)",
        f"resizes {len(f.resizes)}" + "".join(
            f"; {r.job_id} {r.from_size}->{r.to_size} at {r.time_s:.1f} s" for r in f.resizes),
        f"{'job':<20} {'state':<9} {'epochs':>6} {'accuracy':>9} {'finish':>8} {'planned':>8} {'GPU-s':>8}  world sizes",
    ]
    for j in f.jobs:
        lines.append(
            f"{j.job_id:<20} {'finished' if j.finished else 'open':<9} {j.epochs_done:>6} {100 * j.accuracy:>8.1f}% "
            f"{j.actual_finish_s:>8.1f} {j.planned_finish_s:>8.1f} {j.gpu_seconds:>8.1f}  "
            f"{','.join(map(str, j.world_sizes))}")
    lines += [f"{j.job_id} failed: {j.message}" for j in f.jobs if j.state == "FAILED" and j.message]
    return "\n".join(lines)


#: GPUs up to which the Gantt chart names every GPU and labels every bar.
LABELLED_ROWS = 64


def gantt(path: str, all_holds: Sequence[Hold], origin_s: float, plan: Sequence[PlannedSegment] = (),
          plan_origin_s: float | None = None, title: str = "") -> None:
    """Write a PNG: GPUs (rows) over time, one bar per hold; the plan above when given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpu_rows = sorted({g for h in all_holds for g in h.gpus} | {g for s in plan for g in s.gpus})
    row = {g: i for i, g in enumerate(gpu_rows)}
    jobs = sorted({h.job_id for h in all_holds} | {s.job_id for s in plan})
    colours = {j: plt.get_cmap("tab10")(i % 10) for i, j in enumerate(jobs)}
    panels = [("actual", [(h.job_id, h.start_s - origin_s, h.end_s - origin_s, h.gpus) for h in all_holds])]
    if plan:
        shift = (plan_origin_s if plan_origin_s is not None else origin_s) - origin_s
        panels.insert(0, ("planned", [(s.job_id, s.start_s + shift, s.end_s + shift, s.gpus) for s in plan]))
    small = len(gpu_rows) <= LABELLED_ROWS  # a big cluster: no labels, a figure of bounded height
    height = 0.5 * len(gpu_rows) if small else 8.0
    fig, axes = plt.subplots(len(panels), 1, figsize=(10 if small else 16, 1.2 + height * len(panels)),
                             sharex=True, squeeze=False)
    for ax, (name, bars) in zip(axes[:, 0], panels):
        by_job: dict[str, list] = {}
        for job, start, end, gs in bars:
            for g in gs:
                by_job.setdefault(job, []).append((row[g], start, end - start))
                if small:
                    ax.text(start + (end - start) / 2, row[g], job, ha="center", va="center", fontsize=7)
        for job, spans in by_job.items():
            ys, lefts, widths = zip(*spans)
            ax.barh(ys, widths, left=lefts, height=0.8, color=colours[job], edgecolor="black" if small else "none",
                    lw=0.4)
        if small:
            ax.set_yticks(range(len(gpu_rows)), [f"{n}:{i}" for n, i in gpu_rows])
        else:
            ax.set_yticks([])
        ax.set_ylabel(name)
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("seconds after submission")
    if title:
        axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
