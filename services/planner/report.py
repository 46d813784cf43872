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

from dataclasses import asdict, dataclass, replace
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


def text(f: Figures, first_plan: str = "", at_start: dict[str, tuple[str, float]] | None = None) -> str:
    """The report as a few lines of text.

    `first_plan` names the plan the "planned" column and makespan come from (say "v1 (omru-ga)");
    `at_start`: per job, the plan in force when it first started (its name) and the finish that plan
    gave it (after origin), where known. A time not known reads "-"."""
    def t(s: float) -> str:
        return f"{s:.1f}" if s > 0 else "-"

    unplanned = [j.job_id for j in f.jobs if j.planned_finish_s <= 0]
    vs = f"({100 * f.makespan_error:+.1f} %)" if f.planned_makespan_s > 0 and not unplanned else \
        f"(not comparable: {', '.join(unplanned)} not in it)" if f.planned_makespan_s > 0 else ""
    utilisation = f"utilisation {100 * f.utilisation:.1f} % (GPUs held)"
    if f.compute_utilisation >= 0:
        utilisation += f", {100 * f.compute_utilisation:.1f} % (in epochs)"
    lines = [
        f"policy {f.policy or '?'} on {f.gpus} GPUs",
        f"makespan {f.makespan_s:.1f} s actual, {t(f.planned_makespan_s)} s planned by the first plan "
        f"{first_plan or '(none)'} {vs}".rstrip()
        + (f", lower bound {f.lower_bound_s:.1f} s" if f.lower_bound_s else ""),
        utilisation,
        f"resizes {len(f.resizes)}" + "".join(
            f"; {r.job_id} {r.from_size}->{r.to_size} at {r.time_s:.1f} s" for r in f.resizes),
    ]
    rows = [("job", "state", "epochs", "accuracy", "finish", "planned first", "planned at start", "GPU-s",
             "world sizes")]
    for j in f.jobs:
        plan, finish = (at_start or {}).get(j.job_id, ("", 0.0))
        rows.append((j.job_id, (j.state or ("finished" if j.finished else "open")).lower(), str(j.epochs_done),
                     f"{100 * j.accuracy:.1f}%", t(j.actual_finish_s), t(j.planned_finish_s),
                     f"{t(finish)} {plan}" if finish > 0 else "-", f"{j.gpu_seconds:.1f}",
                     ",".join(map(str, j.world_sizes)) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i in (0, 1, 8) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     .rstrip())
    lines += [f"{j.job_id} failed: {j.message}" for j in f.jobs if j.state == "FAILED" and j.message]
    return "\n".join(lines)


def batches(spans: dict[str, tuple[float, float]]) -> list[list[str]]:
    """Jobs grouped into batches, first to last: a batch is a stretch of time its jobs' spans (start,
    end) fill without a gap, each job beginning before the batch so far ended (an idle cluster between
    two submissions parts them)."""
    out: list[list[str]] = []
    end = 0.0
    for job, (start, stop) in sorted(spans.items(), key=lambda kv: (kv[1][0], kv[0])):
        if out and start <= end:
            out[-1].append(job)
            end = max(end, stop)
        else:
            out.append([job])
            end = stop
    return out


def subset(f: Figures, all_holds: Sequence[Hold], job_ids: Sequence[str], start_s: float) -> tuple[Figures, list[Hold]]:
    """The figures and holds of jobs `job_ids` alone, their times moved to count from `start_s` (after
    the old origin; the batch's first start). Utilisation counts the holds of these jobs only;
    the epochs' own share is not known per job (-1); the lower bound was the whole batch's (0)."""
    wanted = set(job_ids)
    hs = [replace(h, start_s=h.start_s - start_s, end_s=h.end_s - start_s) for h in all_holds if h.job_id in wanted]
    jobs = tuple(replace(j, actual_finish_s=max(j.actual_finish_s - start_s, 0.0) if j.actual_finish_s else 0.0,
                         planned_finish_s=max(j.planned_finish_s - start_s, 0.0) if j.planned_finish_s else 0.0)
                 for j in f.jobs if j.job_id in wanted)
    finishes = [j.actual_finish_s for j in jobs if j.actual_finish_s]
    done = all(j.state in ("FINISHED", "FAILED", "CANCELLED") or j.finished for j in jobs)
    makespan = max(finishes) if done and finishes else max(finishes + [h.end_s for h in hs], default=0.0)
    held = sum(len(h.gpus) * max(0.0, min(h.end_s, makespan) - max(h.start_s, 0.0)) for h in hs)
    denom = f.gpus * makespan
    return replace(f, makespan_s=makespan, planned_makespan_s=max((j.planned_finish_s for j in jobs), default=0.0),
                   utilisation=held / denom if denom > 0 else 0.0, compute_utilisation=-1.0, jobs=jobs,
                   lower_bound_s=0.0, resizes=tuple(replace(r, time_s=r.time_s - start_s) for r in f.resizes
                                                    if r.job_id in wanted)), hs


#: GPUs up to which the Gantt chart names every GPU and labels every bar.
LABELLED_ROWS = 64


def gantt(path: str, all_holds: Sequence[Hold], origin_s: float, plan: Sequence[PlannedSegment] = (),
          plan_origin_s: float | None = None, title: str = "", jobs: Sequence[str] = (), plan_name: str = "planned",
          xlabel: str = "seconds after submission") -> None:
    """Write a PNG: GPUs (rows) over time, one bar per hold; the plan above when given (`plan_name`
    labels that panel). A legend names every job (those of `jobs` too), saying which one has no bar
    in a panel; a bar carries its job's name where it is wide enough to read."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    gpu_rows = sorted({g for h in all_holds for g in h.gpus} | {g for s in plan for g in s.gpus})
    row = {g: i for i, g in enumerate(gpu_rows)}
    ran, planned = {h.job_id for h in all_holds}, {s.job_id for s in plan}
    names = sorted(ran | planned | set(jobs))
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colours = {j: cmap(i % cmap.N) for i, j in enumerate(names)}
    panels = [("actual", [(h.job_id, h.start_s - origin_s, h.end_s - origin_s, h.gpus) for h in all_holds])]
    if plan:
        shift = (plan_origin_s if plan_origin_s is not None else origin_s) - origin_s
        panels.insert(0, (plan_name, [(s.job_id, s.start_s + shift, s.end_s + shift, s.gpus) for s in plan]))
    span = max((end for _, bars in panels for _, _, end, _ in bars), default=1.0) or 1.0
    small = len(gpu_rows) <= LABELLED_ROWS  # a big cluster: no labels, a figure of bounded height
    height = max(0.45 * len(gpu_rows), 1.0) if small else 8.0
    fig, axes = plt.subplots(len(panels), 1, figsize=(12 if small else 16, 1.6 + height * len(panels)),
                             sharex=True, squeeze=False)
    for ax, (name, bars) in zip(axes[:, 0], panels):
        by_job: dict[str, list] = {}
        for job, start, end, gs in bars:
            for g in gs:
                by_job.setdefault(job, []).append((row[g], start, end - start))
            fits = int((end - start) / span * 120)  # characters that fit in the bar at this size
            if small and fits >= 3:
                label = job if len(job) <= fits else job[:max(fits - 1, 1)] + "…"
                for g in gs:
                    ax.text(start + (end - start) / 2, row[g], label, ha="center", va="center", fontsize=7,
                            clip_on=True)
        for job, spans in by_job.items():
            ys, lefts, widths = zip(*spans)
            ax.barh(ys, widths, left=lefts, height=0.8, color=colours[job], alpha=0.85,
                    edgecolor="black" if small else "none", lw=0.4)
        if small:
            ax.set_yticks(range(len(gpu_rows)), [f"{n}:{i}" for n, i in gpu_rows], fontsize=8)
        else:
            ax.set_yticks([])
        ax.set_ylabel(name)
        ax.set_ylim(len(gpu_rows) - 0.5, -0.5)
        ax.grid(axis="x", lw=0.3, alpha=0.5)
    notes = {j: ", ".join(n for n, miss in (("not planned", plan and j not in planned), ("did not run", j not in ran))
                          if miss) for j in names}
    handles = [Patch(facecolor=colours[j], edgecolor="black", lw=0.4, label=f"{j} ({notes[j]})" if notes[j] else j)
               for j in names]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, title="jobs",
               ncols=1 + len(names) // 30)
    axes[-1, 0].set_xlabel(xlabel)
    if title:
        axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
