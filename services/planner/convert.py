"""Proto <-> planner dataclasses, in one place (the servicer and dispatcher stay thin).

Nothing is dropped or changed on the way: `job_spec` refuses (SpecError
naming the field) a job the proto JobSpec cannot carry as it is, and
`workload_job` refuses a JobSpec over the input limits or with max_gpus
below min_gpus.
"""

from __future__ import annotations

import math

from omru.v1 import common_pb2, executor_pb2, planner_pb2
from omru.workload import WorkloadJob
from services.executor.worker.spec import SpecError, TrainSpec
from services.planner import report
from services.planner.state import JobRecord
from services.registry import validation

_EVENT_KINDS = {
    executor_pb2.EXECUTOR_EVENT_KIND_STARTED: report.STARTED,
    executor_pb2.EXECUTOR_EVENT_KIND_EPOCH_DONE: report.EPOCH_DONE,
    executor_pb2.EXECUTOR_EVENT_KIND_FINISHED: report.FINISHED,
    executor_pb2.EXECUTOR_EVENT_KIND_GPUS_RELEASED: report.GPUS_RELEASED,
    executor_pb2.EXECUTOR_EVENT_KIND_FAILED: report.FAILED,
}

# JobSpec fields that are TrainSpec fields of the same name and meaning.
_SAME = ("model", "dataset", "epochs", "batch_size", "base_lr", "base_batch", "warmup_epochs", "momentum",
         "weight_decay", "num_classes", "image_size", "frames", "seed", "train_samples", "workdir")


def job_spec(job: WorkloadJob) -> common_pb2.JobSpec:
    """The JobSpec of a job; SpecError naming the field when the JobSpec cannot carry a value as it is."""
    s = job.spec
    if s.lr_decay != "none":
        raise SpecError("lr_decay", f"{s.lr_decay!r} cannot be submitted: the cluster's JobSpec has no lr_decay, its "
                        "workers train with 'none' (`omru train --lr-decay` runs other schedules)")
    if not (math.isfinite(s.warmup_epochs) and s.warmup_epochs == int(s.warmup_epochs)):
        raise SpecError("warmup_epochs", f"must be a whole number of epochs to be submitted (JobSpec counts whole "
                        f"epochs), got {s.warmup_epochs}")
    fields = {k: getattr(s, k) for k in _SAME}
    fields.update(warmup_epochs=int(s.warmup_epochs), min_gpus=s.min_gpus, max_gpus=job.max_gpus)
    for k, v in fields.items():  # (TrainSpec's integers are >= 0)
        bits = 63 if k == "seed" else 31  # JobSpec: int64 seed, int32 the others
        if isinstance(v, int) and v >= 1 << bits:
            raise SpecError(k, f"must be below 2**{bits} to fit the JobSpec, got {v}")
    return common_pb2.JobSpec(job_id=s.job_id, command=list(s.command), env=dict(s.env), **fields)


def workload_job(spec: common_pb2.JobSpec, profile: dict[int, float] | None = None) -> WorkloadJob:
    """JobSpec -> WorkloadJob; raises SpecError (field named) on a bad value."""
    problem = validation.job_spec_problem("", spec)
    if problem:
        raise SpecError(*problem)
    min_gpus = spec.min_gpus or 1
    args = {k: getattr(spec, k) for k in _SAME}
    args.update(command=tuple(spec.command), env=dict(spec.env))
    args["warmup_epochs"] = float(args["warmup_epochs"])
    if not spec.base_batch:
        args["base_batch"] = spec.batch_size
    train = TrainSpec(job_id=spec.job_id, min_gpus=min_gpus, max_gpus=max(min_gpus, spec.max_gpus), **args)
    return WorkloadJob(spec=train, max_gpus=spec.max_gpus, profile=profile or {})


def record_spec(record: JobRecord) -> common_pb2.JobSpec:
    return job_spec(WorkloadJob(spec=TrainSpec.from_dict(record.spec), max_gpus=record.max_gpus))


def gpu_refs(gpus) -> list[common_pb2.GpuRef]:
    return [common_pb2.GpuRef(node_id=n, index=i) for n, i in gpus]


def gpus_of(refs) -> tuple[tuple[str, int], ...]:
    return tuple((g.node_id, g.index) for g in refs)


def event(e: executor_pb2.ExecutorEvent) -> report.Event | None:
    """ExecutorEvent -> report.Event (None for kinds the planner does not know)."""
    kind = _EVENT_KINDS.get(e.kind)
    if kind is None:
        return None
    return report.Event(node_id=e.node_id, job_id=e.job_id, kind=kind, time_s=e.time_unix_s,
                        attempt_id=e.attempt_id, gpus=gpus_of(e.gpus), world_size=e.world_size, epoch=e.epoch,
                        epoch_seconds=e.epoch_seconds, accuracy=e.accuracy, seq=e.seq,
                        message=e.message if kind in (report.FAILED, report.GPUS_RELEASED) else "")


def job_update(r: JobRecord, plan_version: int = 0) -> planner_pb2.JobUpdate:
    return planner_pb2.JobUpdate(
        job_id=r.job_id, state=common_pb2.JobState.Value(f"JOB_STATE_{r.state}"), epochs_done=r.epochs_done,
        world_size=r.world_size, accuracy=r.accuracy, plan_version=plan_version, revision=r.revision,
        message=r.message, time_unix_s=r.finished_s or r.sent_s or r.submitted_s, epochs=r.epochs, owner=r.owner,
        submitted_unix_s=r.submitted_s)


def plan(p: dict | None) -> planner_pb2.Plan:
    if not p:
        return planner_pb2.Plan()
    return planner_pb2.Plan(
        version=p["version"], policy=p["policy"], makespan_s=p["makespan_s"], created_unix_s=p["created_unix_s"],
        segments=[common_pb2.Segment(job_id=s["job"], start_s=s["start_s"], end_s=s["end_s"],
                                     gpus=gpu_refs(s["gpus"]), epochs=s["epochs"]) for s in p["segments"]])


def planned_segments(p: dict | None) -> list[report.PlannedSegment]:
    if not p:
        return []
    return [report.PlannedSegment(s["job"], s["start_s"], s["end_s"], tuple((n, int(i)) for n, i in s["gpus"]))
            for s in p["segments"]]


def report_proto(f: report.Figures, holds=(), first_plan: dict | None = None,
                 origin_s: float = 0.0) -> planner_pb2.Report:
    return planner_pb2.Report(
        makespan_s=f.makespan_s, planned_makespan_s=f.planned_makespan_s, utilisation=f.utilisation,
        compute_utilisation=f.compute_utilisation, policy=f.policy, gpus=f.gpus, lower_bound_s=f.lower_bound_s,
        origin_unix_s=origin_s, first_plan=plan(first_plan),
        holds=[planner_pb2.GpuHold(job_id=h.job_id, attempt_id=h.attempt_id, gpu=common_pb2.GpuRef(node_id=n, index=i),
                                   start_s=h.start_s - origin_s, end_s=h.end_s - origin_s, world_size=h.world_size)
               for h in holds for n, i in h.gpus],
        resizes=[planner_pb2.Resize(job_id=r.job_id, time_s=r.time_s, from_size=r.from_size, to_size=r.to_size)
                 for r in f.resizes],
        jobs=[planner_pb2.JobResult(
            job_id=j.job_id, state=common_pb2.JobState.Value(f"JOB_STATE_{j.state or 'PENDING'}"),
            epochs_done=j.epochs_done, accuracy=j.accuracy, planned_finish_s=j.planned_finish_s,
            actual_finish_s=j.actual_finish_s, gpu_seconds=j.gpu_seconds, world_sizes=list(j.world_sizes),
            message=j.message)
            for j in f.jobs])


def directive(kind: int, r: JobRecord, gpus, rendezvous: str, checkpoint_dir: str, directive_id: str) -> executor_pb2.Directive:
    return executor_pb2.Directive(
        directive_id=directive_id, kind=kind, job=record_spec(r), gpus=gpu_refs(gpus),
        rendezvous_endpoint=rendezvous, attempt_id=r.attempt_id, checkpoint_dir=checkpoint_dir)
