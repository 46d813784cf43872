"""Profiles from CSV: `job,epochs,gpus,epoch_seconds` (+ optional columns).

One row per job and GPU count measured (a job needs no row at the counts
between, see model.py `epoch_table`). Optional columns:
- `task`: rows of other tasks are dropped when a task is asked for;
- `nodes`: the row's epoch time holds for its GPUs spread over that many
  nodes (placement); a blank `nodes` is the job's time on its best
  placement, and where a GPU count has only `nodes` rows the fastest of them
  is;
- `arrival_s`: when the job arrives (seconds, >= 0; the same on each of the
  job's rows, or blank);
- `requested_gpus`: the GPU count rigid baselines keep (same rule).
 Used by `omru simulate`, the benches and the
planner service; every error names the file, the line and the bad value.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Sequence

from services.planner.core.model import Job, PlanningError

REQUIRED = ("job", "epochs", "gpus", "epoch_seconds")


def load_csv(path: str | Path, task: str | None = None) -> list[Job]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanningError(f"cannot read profiles {str(path)!r}: {exc.strerror}") from None
    return parse_csv(text, task=task, source=str(path))


def parse_csv(text: str, task: str | None = None, source: str = "profiles") -> list[Job]:
    # Leading comment lines are dropped (and counted), later ones become blank
    # lines (csv skips them), so the line numbers in messages stay true.
    lines = ["" if line.lstrip().startswith("#") else line for line in text.splitlines()]
    skipped = 0
    while skipped < len(lines) and not lines[skipped].strip():
        skipped += 1
    rows = csv.DictReader(io.StringIO("\n".join(lines[skipped:])))
    header = rows.fieldnames or []
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise PlanningError(f"{source}: missing column(s) {', '.join(missing)} (header: {','.join(header) or 'empty'})")
    if task is not None and "task" not in header:
        raise PlanningError(f"{source}: --task {task!r} given but the file has no 'task' column")
    epochs: dict[str, int] = {}
    times: dict[str, dict[int, float]] = {}
    spread: dict[str, dict[tuple[int, int], float]] = {}
    extra: dict[str, dict[str, object]] = {}
    tasks: set[str] = set()
    for row in rows:
        where = f"{source} line {rows.line_num + skipped}"
        if None in row or any(row.get(c) is None for c in REQUIRED):
            raise PlanningError(f"{where}: expected {len(header)} fields")
        if "task" in header:
            tasks.add(row["task"])
            if task is not None and row["task"] != task:
                continue
        job = row["job"].strip()
        if not job:
            raise PlanningError(f"{where}: empty job name")
        e = _number(row["epochs"], int, "epochs", where)
        g = _number(row["gpus"], int, "gpus", where)
        t = _number(row["epoch_seconds"], float, "epoch_seconds", where)
        if epochs.setdefault(job, e) != e:
            raise PlanningError(f"{where}: job {job!r} has epochs {e} here but {epochs[job]} earlier")
        times.setdefault(job, {})
        nodes_raw = (row.get("nodes") or "").strip()
        if nodes_raw:
            k = _number(nodes_raw, int, "nodes", where)
            if k > g:
                raise PlanningError(f"{where}: nodes {k} is more than the row's {g} GPUs")
            if (g, k) in spread.setdefault(job, {}):
                raise PlanningError(f"{where}: job {job!r} has two rows for {g} GPUs over {k} nodes")
            spread[job][(g, k)] = t
        else:
            if g in times[job]:
                raise PlanningError(f"{where}: job {job!r} has two rows for {g} GPUs")
            times[job][g] = t
        for column, kind in (("arrival_s", float), ("requested_gpus", int)):
            raw = (row.get(column) or "").strip()
            if not raw:
                continue
            value = _number(raw, kind, column, where, allow_zero=column == "arrival_s")
            if extra.setdefault(job, {}).setdefault(column, value) != value:
                raise PlanningError(f"{where}: job {job!r} has {column} {raw} here but {extra[job][column]} earlier")
    if not times:
        if task is not None:
            raise PlanningError(f"{source}: no rows for task {task!r} (tasks: {', '.join(sorted(tasks))})")
        raise PlanningError(f"{source}: no profile rows")
    jobs = []
    for job in times:
        placement = spread.get(job, {})
        fastest: dict[int, float] = {}  # per GPU count, its fastest measured placement
        for (g, _), t in placement.items():
            fastest[g] = min(t, fastest.get(g, t))
        for g in sorted(fastest):
            times[job].setdefault(g, fastest[g])
        jobs.append(Job(job, epochs[job], times[job], placement=placement, **extra.get(job, {})))
    return jobs


def _number(raw: str, kind: type, name: str, where: str, allow_zero: bool = False):
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise PlanningError(f"{where}: {name} {raw!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise PlanningError(f"{where}: {name} must be {'>= 0' if allow_zero else 'positive'}, got {raw!r}")
    return value


def to_csv(jobs: Sequence[Job]) -> str:
    """The CSV `parse_csv` reads back as the same jobs: a row per GPU count and per measured placement."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*REQUIRED, "nodes", "arrival_s", "requested_gpus"])
    for j in jobs:
        extra = [repr(j.arrival_s), j.requested_gpus or ""]
        for g, t in j.profile.items():
            w.writerow([j.id, j.epochs, g, repr(t), "", *extra])
        for (g, k), t in j.placement.items():
            w.writerow([j.id, j.epochs, g, repr(t), k, *extra])
    return out.getvalue()
