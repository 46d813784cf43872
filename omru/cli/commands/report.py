"""`omru report`: one batch's makespan, utilisation, per-job outcome, planned against actual, Gantt.

A batch is a stretch of time the jobs fill without a gap (an idle cluster between two submissions
parts them); batches are numbered 1, 2, ... from the first. Without --batch or --since the report is
of the newest batch. Each job's finish is set against two plans, both named: the batch's first plan
(what its makespan compares with) and the plan in force when the job first started, where the
planner still tells which that was (it keeps the first plan and the one in force now, not those in
between: "-" otherwise). Times count from the first submission, or, for a batch that is not the
first, from its first start.
"""

from __future__ import annotations

import re
import time

from omru.cli import plannerargs
from omru.cli.commands.status import clock


def _state_names() -> dict[int, str]:
    from omru.v1 import common_pb2

    return {v.number: v.name.removeprefix("JOB_STATE_") for v in common_pb2.JobState.DESCRIPTOR.values}


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="report on a batch of jobs", description=__doc__)
    p.add_argument("--json", dest="json_file", default=None, metavar="FILE", help="also write the report as JSON")
    p.add_argument("--gantt", default=None, metavar="FILE.png", help="also draw GPUs over time (planned and actual)")
    p.add_argument("--batch", default=None, metavar="N",
                   help="the Nth batch (1 = the first; -1 the newest, the default), or 'all'")
    p.add_argument("--since", default=None, metavar="TIME",
                   help="only jobs active since TIME: 2026-12-07T22:00[:00], 22:00[:00] (today), or 30m, 2h, 1d ago")
    plannerargs.add(p)
    p.set_defaults(func=handle)


def parse_since(value: str, now: float | None = None) -> float:
    """--since as Unix seconds; CliError naming a value that is no time."""
    from datetime import datetime

    from omru.cli.main import CliError

    now = time.time() if now is None else now
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", value.strip())
    if m:
        return now - float(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]
    try:
        if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", value.strip()):
            day = datetime.fromtimestamp(now).date().isoformat()
            return datetime.fromisoformat(f"{day}T{value.strip()}").timestamp()
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        raise CliError(f"--since: {value!r} is not a time (2026-12-07T22:00, 22:00, or 30m, 2h, 1d ago)") from None


def parse_batch(value: str | None) -> int | None:
    """--batch as an index (1 = first, -1 = newest) or None for all; CliError naming a bad value."""
    from omru.cli.main import CliError

    if value is None:
        return -1
    if value == "all":
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n == 0:
        raise CliError(f"--batch: {value!r} is not a batch number (1, 2, ...; -1 the newest) or 'all'")
    return n


def figures_of(proto):
    """A Report proto -> (report.Figures, holds, first-plan segments, plan origin)."""
    from services.planner import report

    holds = [report.Hold(h.job_id, h.attempt_id, h.gpu.node_id, ((h.gpu.node_id, h.gpu.index),), h.start_s, h.end_s,
                         h.world_size) for h in proto.holds]
    first = proto.first_plan
    segments = [report.PlannedSegment(s.job_id, s.start_s, s.end_s, tuple((g.node_id, g.index) for g in s.gpus))
                for s in first.segments]
    names = _state_names()
    jobs = tuple(report.JobFigures(
        job_id=j.job_id, finished=j.state == 7, epochs_done=j.epochs_done, accuracy=j.accuracy,
        actual_finish_s=j.actual_finish_s, planned_finish_s=j.planned_finish_s, gpu_seconds=j.gpu_seconds,
        world_sizes=tuple(j.world_sizes), state=names.get(j.state, ""),
        message=j.message) for j in proto.jobs)
    resizes = tuple(report.Resize(r.job_id, r.time_s, r.from_size, r.to_size) for r in proto.resizes)
    f = report.Figures(makespan_s=proto.makespan_s, planned_makespan_s=proto.planned_makespan_s,
                       utilisation=proto.utilisation, compute_utilisation=proto.compute_utilisation,
                       gpus=proto.gpus, jobs=jobs, resizes=resizes, policy=proto.policy, lower_bound_s=proto.lower_bound_s)
    shift = first.created_unix_s - proto.origin_unix_s if first.created_unix_s else 0.0
    return f, holds, segments, shift


def plan_at(t: float, first, current):
    """The plan in force at Unix time t, where the two plans the planner keeps tell (None otherwise)."""
    if current is None:
        return None
    if current.version and current.created_unix_s <= t:
        return current
    if first.version and first.created_unix_s <= t and (current.version in (
            first.version, first.version + 1)):
        return first
    return None


def select(proto, plan=None, jobs=(), since: float | None = None, batch: int | None = None):
    """The report of one batch (index, None: all) of the jobs active since `since` (Unix s):
    (Figures, holds, planned segments, origin shift, at_start, header lines). Times after the
    report's origin, or the batch's first start where it is not the first batch."""
    from omru.cli.main import CliError
    from services.planner import report

    f, holds, _, _ = figures_of(proto)
    origin = proto.origin_unix_s
    times = {j.job_id: j.time_unix_s - origin for j in jobs if j.time_unix_s}
    began: dict[str, float] = {}
    ended: dict[str, float] = {}
    for h in holds:
        began[h.job_id] = min(began.get(h.job_id, h.start_s), h.start_s)
        ended[h.job_id] = max(ended.get(h.job_id, h.end_s), h.end_s)
    spans = {j.job_id: (began[j.job_id], ended[j.job_id]) if j.job_id in began else (times.get(j.job_id, 0.0),) * 2
             for j in f.jobs}
    groups = report.batches(spans)
    header = []
    chosen = [j.job_id for j in f.jobs]
    if batch is not None and (groups or batch != -1):
        if not -len(groups) <= batch <= len(groups):
            raise CliError(f"--batch: {batch} is not a batch: there {'is' if len(groups) == 1 else 'are'} "
                           f"{len(groups)} (1..{len(groups)})")
        chosen = groups[batch - 1 if batch > 0 else batch]
        number = groups.index(chosen) + 1
        header.append(f"batch {number} of {len(groups)}, from {clock(origin + spans[chosen[0]][0])}: "
                      f"{len(chosen)} jobs" + (" (--batch N for another, --batch all for every job)"
                                               if len(groups) > 1 else ""))
    if since is not None:
        chosen = [j for j in chosen if spans[j][1] >= since - origin]
        header.append(f"jobs active since {clock(since)}: {len(chosen)}")
    start = 0.0
    if set(chosen) != {j.job_id for j in f.jobs}:
        # (the first batch counts from the first submission, the report's origin, as the whole does)
        start = 0.0 if groups and set(groups[0]) <= set(chosen) else max(
            0.0, min((spans[j][0] for j in chosen), default=0.0))
        f, holds = report.subset(f, holds, chosen, start)
        if start:
            header.append(f"times count from {clock(origin + start)} (the batch's first start)")
    first = proto.first_plan
    at_start, segments, used = {}, [], set()
    for j in f.jobs:
        began = min((h.start_s for h in holds if h.job_id == j.job_id), default=None)
        p = plan_at(origin + start + began, first, plan) if began is not None else None
        mine = [s for s in p.segments if s.job_id == j.job_id] if p is not None else []
        if mine:
            at_start[j.job_id] = (f"v{p.version}", p.created_unix_s - origin - start + max(s.end_s for s in mine))
        # the planned panel: the plan at its start, else the first plan, else the one in force now
        for candidate in (p, first, plan):
            mine = [s for s in candidate.segments if s.job_id == j.job_id] if candidate is not None else []
            if mine:
                used.add(f"v{candidate.version}")
                shift = candidate.created_unix_s - origin - start
                segments += [report.PlannedSegment(s.job_id, s.start_s + shift, s.end_s + shift, tuple(
                    (g[0], g[1]) if isinstance(g, tuple) else (g.node_id, g.index) for g in s.gpus)) for s in mine]
                break
    first_name = f"v{first.version} ({first.policy})" if first.version else ""
    return f, holds, segments, at_start, first_name, sorted(used), header


def write(proto, json_file: str | None, gantt_file: str | None, out=None, plan=None, jobs=(),
          since: float | None = None, batch: int | None = None) -> "object":
    """Print the text report (of `batch`, None: every job; `since`: only jobs active since), write the
    JSON and the Gantt PNG when asked; returns the Figures. `plan`: the plan in force now (PlanInfo);
    `jobs`: ListJobs' JobStatus (their times place jobs that never ran)."""
    import json
    import sys

    from services.planner import report

    f, holds, segments, at_start, first_name, used, header = select(proto, plan, jobs, since, batch)
    print("\n".join(header + [report.text(f, first_name, at_start)]), file=out or sys.stdout)
    if json_file:
        with open(json_file, "w", encoding="utf-8") as fh:
            json.dump({**f.to_dict(), "first_plan": first_name, "header": header,
                       "planned_at_start": {j: {"plan": p, "finish_s": t} for j, (p, t) in at_start.items()}},
                      fh, indent=2)
    if gantt_file:
        report.gantt(gantt_file, holds, 0.0, plan=segments, plan_origin_s=0.0, jobs=[j.job_id for j in f.jobs],
                     plan_name=f"planned ({', '.join(used)})" if used else "planned",
                     xlabel="seconds after the batch's first start"
                     if any(h.startswith("times count from") for h in header) else "seconds after submission",
                     title=f"{f.policy}: makespan {f.makespan_s:.0f} s, utilisation {100 * f.utilisation:.0f} %")
    return f


def handle(args) -> int:
    import grpc

    since = parse_since(args.since) if args.since is not None else None
    batch = parse_batch(args.batch if args.batch is not None or since is None else "all")
    with plannerargs.client(args) as c:
        try:
            proto, plan, jobs = c.report_proto(), c.plan(), c.list_jobs()
        except grpc.RpcError as exc:
            raise plannerargs.rpc_error(exc) from None
    write(proto, args.json_file, args.gantt, plan=plan, jobs=jobs, since=since, batch=batch)
    return 0
