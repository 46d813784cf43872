"""`omru report`: makespan, utilisation, per-job accuracy and epochs, planned vs actual, Gantt chart."""

from __future__ import annotations

from omru.cli import plannerargs


def _state_names() -> dict[int, str]:
    from omru.v1 import common_pb2

    return {v.number: v.name.removeprefix("JOB_STATE_") for v in common_pb2.JobState.DESCRIPTOR.values}


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="report on the batch so far", description=__doc__)
    p.add_argument("--json", dest="json_file", default=None, metavar="FILE", help="also write the report as JSON")
    p.add_argument("--gantt", default=None, metavar="FILE.png", help="also draw GPUs over time (planned and actual)")
    plannerargs.add(p)
    p.set_defaults(func=handle)


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


def write(proto, json_file: str | None, gantt_file: str | None, out=None) -> "object":
    """Print the text report, write the JSON and the Gantt PNG when asked; returns the Figures."""
    import json
    import sys

    from services.planner import report

    f, holds, segments, plan_shift = figures_of(proto)
    print(report.text(f), file=out or sys.stdout)
    if json_file:
        with open(json_file, "w", encoding="utf-8") as fh:
            json.dump(f.to_dict(), fh, indent=2)
    if gantt_file:
        # holds are relative to the origin; plan segments to the plan's creation
        report.gantt(gantt_file, holds, 0.0, plan=segments, plan_origin_s=plan_shift,
                     title=f"{f.policy}: makespan {f.makespan_s:.0f} s, utilisation {100 * f.utilisation:.0f} %")
    return f


def handle(args) -> int:
    import grpc

    with plannerargs.client(args) as c:
        try:
            proto = c.report_proto()
        except grpc.RpcError as exc:
            raise plannerargs.rpc_error(exc) from None
    write(proto, args.json_file, args.gantt)
    return 0
