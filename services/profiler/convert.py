"""Proto <-> profiler dataclasses, in one place.

A JobSpec is checked exactly as the executor would check it (the executor's
`train_spec`, with the same defaults for unset fields), so a profile request
the executors would refuse is refused up front, naming the field
("job.model", "job.batch_size", ...).
"""

from __future__ import annotations

import hashlib
import json

from omru.v1 import common_pb2, profiler_pb2
from services.executor.convert import DEFAULT_IMAGE_SIZE, train_spec
from services.executor.supervisor import DirectiveError
from services.executor.worker.spec import TrainSpec
from services.profiler.store import ProfileKey, StoredProfile


class BadRequest(ValueError):
    """A request value that cannot be profiled; field names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


def job(spec: common_pb2.JobSpec) -> tuple[common_pb2.JobSpec, TrainSpec]:
    """The job as sent (epochs 0 -> 1: a trial needs none) and its validated TrainSpec."""
    if not spec.job_id:
        raise BadRequest("job.job_id", "is required")
    sent = common_pb2.JobSpec()
    sent.CopyFrom(spec)
    sent.epochs = sent.epochs or 1
    if sent.batch_size <= 0:
        raise BadRequest("job.batch_size", f"must be >= 1, got {sent.batch_size}")
    try:
        return sent, train_spec(sent, field="job")
    except DirectiveError as exc:
        raise BadRequest(exc.field, str(exc).split(": ", 1)[1]) from None


def input_shape(spec: TrainSpec) -> str:
    """Shape of one sample: "3xSxS" for images, "3xTxSxS" for clips (every data set yields 3 channels)."""
    size = spec.image_size or DEFAULT_IMAGE_SIZE
    dims = (3, spec.frames, size, size) if spec.frames else (3, size, size)
    return "x".join(str(d) for d in dims)


def key(spec: TrainSpec, gpu_kind: str, nodes: int, full_epoch: bool) -> ProfileKey:
    if spec.is_script:  # what decides its speed is the script itself: its command, folder and environment
        what = json.dumps([list(spec.command), spec.workdir, sorted(dict(spec.env).items())])
        return ProfileKey(model=f"script-{hashlib.sha256(what.encode()).hexdigest()[:16]}", input_shape="script",
                          batch_size=spec.batch_size, gpu_kind=gpu_kind, nodes=nodes, dataset="", train_samples=0,
                          full_epoch=full_epoch)
    return ProfileKey(model=spec.model, input_shape=input_shape(spec), batch_size=spec.batch_size, gpu_kind=gpu_kind,
                      nodes=nodes, dataset=spec.dataset, train_samples=spec.train_samples, full_epoch=full_epoch)


def profile(p: StoredProfile) -> profiler_pb2.Profile:
    k = p.key
    return profiler_pb2.Profile(
        key=profiler_pb2.ProfileKey(model=k.model, input_shape=k.input_shape, batch_size=k.batch_size, gpu_kind=k.gpu_kind,
                                    nodes=k.nodes, dataset=k.dataset, train_samples=k.train_samples, full_epoch=k.full_epoch),
        points=[profiler_pb2.ProfilePoint(gpus=q.gpus, nodes=q.nodes, epoch_seconds=q.epoch_seconds, measured=q.measured,
                                          iter_seconds=q.iter_seconds, steps=q.steps) for q in p.points],
        fit_error=p.fit_error, created_unix_s=p.created_unix_s,
        fit=profiler_pb2.ScalingFit(a=p.fit[0], b=p.fit[1], c=p.fit[2]))


def progress(job_id: str, state: int, gpus: int = 0, **fields) -> profiler_pb2.ProfileResponse:
    return profiler_pb2.ProfileResponse(progress=profiler_pb2.ProfileProgress(job_id=job_id, gpus=gpus, state=state, **fields))
