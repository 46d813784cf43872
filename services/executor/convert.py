"""Proto <-> executor dataclasses: allocations (Directive) in, events and jobs out.

JobSpec -> TrainSpec keeps every value as sent, except where the proto says
0 means "not set": image_size 0 = 32, base_batch 0 = batch_size (so lr =
base_lr x world size), min_gpus 0 = 1, max_gpus 0 = any number. Every bad
value (out of range, or over the input limits of `validation`) raises
`DirectiveError` naming the field as the client sent it
("directive.job.model", "directive.gpus[1].index", ...).

A directive names folders of the node only under its `Roots`: a
checkpoint_dir under the checkpoint root, the folder of an imagefolder: or
clips: data set under one of the data roots, both after resolving '..' and
symlinks (os.path.realpath); the checkpoint_dir passed on is the resolved one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field as dataclass_field

from omru.spec import shown
from omru.v1 import common_pb2, executor_pb2
from services.common.config import default_checkpoint_root
from services.executor.state import JobState
from services.executor.supervisor import Directive, DirectiveError, Event, EventKind, Gpu, JobView
from services.executor.worker.spec import BUILTIN_DATASETS, ProfileSpec, SpecError, TrainSpec, dataset_folder
from services.registry import validation

#: max_gpus of a job that may run on any number of GPUs.
ANY_GPUS = 1 << 20
DEFAULT_IMAGE_SIZE = 32
DEFAULT_WARMUP_ITERS = 3
DEFAULT_MEASURE_ITERS = 10
#: Characters of a path an error message shows (paths run longer than other values).
PATH_SHOWN = 256

_EVENT_KINDS = {
    EventKind.STARTED: executor_pb2.EXECUTOR_EVENT_KIND_STARTED,
    EventKind.EPOCH_DONE: executor_pb2.EXECUTOR_EVENT_KIND_EPOCH_DONE,
    EventKind.FINISHED: executor_pb2.EXECUTOR_EVENT_KIND_FINISHED,
    EventKind.GPUS_RELEASED: executor_pb2.EXECUTOR_EVENT_KIND_GPUS_RELEASED,
    EventKind.FAILED: executor_pb2.EXECUTOR_EVENT_KIND_FAILED,
    EventKind.PROFILED: executor_pb2.EXECUTOR_EVENT_KIND_PROFILED,
}
_STATES = {
    JobState.STARTING: common_pb2.JOB_STATE_STARTING,
    JobState.RUNNING: common_pb2.JOB_STATE_RUNNING,
    JobState.RESIZING: common_pb2.JOB_STATE_RESIZING,
    JobState.RESTARTING: common_pb2.JOB_STATE_STARTING,
    JobState.STOPPING: common_pb2.JOB_STATE_RESIZING,
    JobState.STOPPED: common_pb2.JOB_STATE_WAITING,
    JobState.FINISHED: common_pb2.JOB_STATE_FINISHED,
    JobState.FAILED: common_pb2.JOB_STATE_FAILED,
}


@dataclass(frozen=True)
class Roots:
    """The folders of a node that directives may name (absolute, resolved: see ExecutorConfig)."""

    checkpoint: str = dataclass_field(default_factory=lambda: os.path.realpath(default_checkpoint_root()))
    data: tuple[str, ...] = ()  # none: only the built-in data sets


def _problem(problem) -> None:
    if problem is not None:
        raise DirectiveError(*problem)


def _confined(field: str, value: str, folder: str, roots: tuple[str, ...], where: str) -> str:
    """`folder` (named by the field's `value`) resolved ('..', symlinks) when it lies under one of `roots`,
    else DirectiveError naming the field and its value."""
    real = os.path.realpath(folder)
    if any(os.path.commonpath([real, root]) == root for root in roots):
        return real
    resolved = f" (resolved {shown(real, PATH_SHOWN)})" if real != folder else ""
    raise DirectiveError(field, f"{shown(value, PATH_SHOWN)}{resolved} is not under {where}")


def _check_paths(d: executor_pb2.Directive, spec: TrainSpec, roots: Roots) -> str:
    """The directive's checkpoint_dir, resolved ("" stays ""); DirectiveError for a folder outside the roots."""
    folder = dataset_folder(spec.dataset)
    if folder:
        where = (f"a data root of this node ({', '.join(map(repr, roots.data))})" if roots.data else
                 f"a data root of this node: it has none, so only {' and '.join(BUILTIN_DATASETS)} may be used")
        _confined("directive.job.dataset", spec.dataset, folder, roots.data, where)
    if not d.checkpoint_dir:
        return ""
    return _confined("directive.checkpoint_dir", d.checkpoint_dir, d.checkpoint_dir, (roots.checkpoint,),
                     f"this node's checkpoint root {roots.checkpoint!r}")


def train_spec(job: common_pb2.JobSpec, field: str = "directive.job") -> TrainSpec:
    """The TrainSpec of a JobSpec (see the module docstring for the 0 defaults)."""
    _problem(validation.job_spec_problem(field, job))
    min_gpus = job.min_gpus or 1
    try:
        return TrainSpec(
            job_id=job.job_id, model=job.model, dataset=job.dataset, epochs=job.epochs, batch_size=job.batch_size,
            base_lr=job.base_lr, base_batch=job.base_batch or job.batch_size, warmup_epochs=job.warmup_epochs,
            momentum=job.momentum, weight_decay=job.weight_decay, num_classes=job.num_classes,
            image_size=job.image_size or DEFAULT_IMAGE_SIZE, frames=job.frames, min_gpus=min_gpus,
            max_gpus=job.max_gpus or max(ANY_GPUS, min_gpus), seed=job.seed, train_samples=job.train_samples,
            command=tuple(job.command), workdir=job.workdir, env=dict(job.env))
    except SpecError as exc:
        raise DirectiveError(f"{field}.{exc.field}", str(exc).split(": ", 1)[1]) from None


def profile_spec(options: executor_pb2.ProfileOptions, field: str = "directive.profile") -> ProfileSpec:
    warmup = options.warmup_iters if options.HasField("warmup_iters") else DEFAULT_WARMUP_ITERS
    try:
        return ProfileSpec(mode="epoch" if options.full_epoch else "sampled", warmup_iters=warmup,
                           measure_iters=options.measure_iters or DEFAULT_MEASURE_ITERS)
    except SpecError as exc:
        raise DirectiveError(f"{field}.{exc.field.removeprefix('profile.')}", str(exc).split(": ", 1)[1]) from None


def directive(d: executor_pb2.Directive, roots: Roots | None = None) -> Directive:
    """The Directive of a node's allocation (kind START or RESIZE: both name the attempt to run; its
    removal stops the job), with its folders confined to the node's roots (None: the default checkpoint
    root, no data root)."""
    _problem(validation.id_problem("directive.directive_id", d.directive_id))
    if d.kind not in (executor_pb2.DIRECTIVE_KIND_START, executor_pb2.DIRECTIVE_KIND_RESIZE):
        raise DirectiveError("directive.kind", f"{d.kind} is not START or RESIZE (an allocation names the "
                             f"attempt to run; removing it stops the job)")
    _problem(validation.id_problem("directive.job.job_id", d.job.job_id))
    spec = train_spec(d.job)
    _problem(validation.gpu_refs_problem("directive.gpus", d.gpus))
    if d.rendezvous_endpoint:  # port 0: rank 0 picks it (see AttemptSpec)
        _problem(validation.address_problem("directive.rendezvous_endpoint", d.rendezvous_endpoint, port_zero=True))
    if d.attempt_id:
        _problem(validation.id_problem("directive.attempt_id", d.attempt_id))
    _problem(validation.text_problem("directive.checkpoint_dir", d.checkpoint_dir))
    checkpoint_dir = _check_paths(d, spec, roots or Roots())
    profile = profile_spec(d.profile) if d.HasField("profile") else None
    return Directive(
        directive_id=d.directive_id, job_id=spec.job_id, spec=spec,
        gpus=tuple(Gpu(g.node_id, g.index) for g in d.gpus), rendezvous=d.rendezvous_endpoint,
        attempt_id=d.attempt_id, checkpoint_dir=checkpoint_dir, profile=profile)


def gpu_ref(gpu: Gpu) -> common_pb2.GpuRef:
    return common_pb2.GpuRef(node_id=gpu.node_id, index=gpu.index)


def gpu(ref: common_pb2.GpuRef) -> Gpu:
    return Gpu(ref.node_id, ref.index)


def event(e: Event) -> executor_pb2.ExecutorEvent:
    return executor_pb2.ExecutorEvent(
        seq=e.seq, node_id=e.node_id, job_id=e.job_id, kind=_EVENT_KINDS[e.kind], time_unix_s=e.time_unix_s,
        epoch=e.epoch, epoch_seconds=e.epoch_seconds, loss=e.loss, accuracy=e.accuracy, lr=e.lr,
        world_size=e.world_size, gpus=[gpu_ref(g) for g in e.gpus], attempt_id=e.attempt_id, message=e.message,
        iter_seconds=e.iter_seconds, steps=e.steps, global_batch=e.global_batch, restarts=e.restarts)


def job_state(state: JobState, profiling: bool = False) -> int:
    """The planner-level JobState of an executor state (a running trial is PROFILING)."""
    if profiling and state in (JobState.STARTING, JobState.RUNNING):
        return common_pb2.JOB_STATE_PROFILING
    return _STATES[state]


def job(view: JobView) -> executor_pb2.ExecutorJob:
    return executor_pb2.ExecutorJob(
        job_id=view.job_id, attempt_id=view.attempt_id, local_gpus=[gpu_ref(g) for g in view.local_gpus],
        world_size=view.world_size, epochs_done=view.epochs_done, state=job_state(view.state, view.profile),
        phase=view.state.value, restarts=view.restarts, profile=view.profile, worker_pids=list(view.worker_pids),
        message=view.message)
