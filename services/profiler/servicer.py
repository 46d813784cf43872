"""omru.v1.ProfilerService: measured epoch times on 1, 2, 4, ... GPUs.

`Profile` checks the request (INVALID_ARGUMENT naming the field: unknown
model or data set, zero batch, a GPU count above the cluster's, a value over
the input limits), serves a
stored profile when one covers the counts asked (unless refresh), else runs
one trial per missing count through the planner (`trials`: the planner
claims the GPUs and allocates the trial like any other attempt), turns
steady-state iteration time x iterations per epoch into epoch seconds, fits
t(g) = a + b/g + c(g-1) for the counts not measured (`fit`), stores the
profile (`store`) and streams progress: QUEUED (waiting for GPUs),
MEASURING, MEASURED, then DONE with the profile, or FAILED when a trial
crashed (nothing is stored then). Requests for the same key run one at a
time, so a second identical request is served from the store.
"""

from __future__ import annotations

import asyncio
import collections
import time

import grpc

from omru.spec import MAX_NAME
from omru.v1 import profiler_pb2, profiler_pb2_grpc
from services.common.errors import abort, abort_invalid, grpc_errors
from services.common.logging import get_logger
from services.profiler import convert, fit
from services.profiler.metrics import ProfilerMeter
from services.profiler.store import ProfileStore, StoredPoint, StoredProfile
from services.profiler.trials import PlannerTrials, TrialFailed
from services.registry import validation

log = get_logger(__name__)
S = profiler_pb2


class ProfilerServicer(profiler_pb2_grpc.ProfilerServiceServicer):
    """omru.v1.ProfilerService over a ProfileStore and a trial runner."""

    def __init__(self, store: ProfileStore, trials: PlannerTrials) -> None:
        self.store = store
        self.trials = trials
        self._locks: collections.defaultdict = collections.defaultdict(asyncio.Lock)
        self.meter = ProfilerMeter()  # trials and profiles as they happen (metrics.py)

    async def _job(self, request, context):
        if not request.HasField("job"):
            await abort_invalid(context, "job", "is required")
        try:
            return convert.job(request.job)
        except convert.BadRequest as exc:
            await abort_invalid(context, exc.field, exc.problem)

    async def _shape(self, context):
        try:
            return await self.trials.shape()
        except grpc.aio.AioRpcError as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, f"registry ListNodes failed: {exc.code().name}: {exc.details()}")

    @grpc_errors
    async def Profile(self, request, context):
        job, spec = await self._job(request, context)
        shape = await self._shape(context)
        kind = shape.main_kind()
        total = shape.total(kind)
        if total == 0:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, "the cluster has no GPUs (no executor registered)")
        for i, g in enumerate(request.gpu_counts):
            if not 1 <= g <= total:
                await abort_invalid(context, f"gpu_counts[{i}]", f"{g} is not in 1..{total} (the cluster has {total} {kind} GPUs)")
        if not 0 <= request.max_gpus <= total:
            await abort_invalid(context, "max_gpus", f"{request.max_gpus} is not in 0..{total} (the cluster has {total} {kind} GPUs)")
        top = request.max_gpus or (max(request.gpu_counts) if request.gpu_counts else total)
        counts = fit.trial_counts(top, request.gpu_counts)
        key = convert.key(spec, kind, shape.nodes_for(max(counts), kind), request.full_epoch)
        async with self._locks[key]:
            stored = await self.store.get(key)
            have = {} if stored is None or request.refresh else stored.measured()
            missing = [g for g in counts if g not in have]
            if not missing and stored is not None and len(stored.points) >= top:
                log.info("profile_cached", job_id=job.job_id, key=key.path())
                self.meter.profiles.labels("cached").inc()
                yield convert.progress(job.job_id, S.PROFILE_STATE_DONE, top, message="served from the store",
                                       profile=convert.profile(stored), cached=True)
                return
            measured = dict(have)
            began = time.monotonic()
            for g in missing:
                yield convert.progress(job.job_id, S.PROFILE_STATE_MEASURING, g)
                try:
                    async for item in self._trial(job, g, kind, request.full_epoch):
                        if isinstance(item, str):
                            yield convert.progress(job.job_id, S.PROFILE_STATE_QUEUED, g, message=item)
                        else:
                            measured[g] = item
                except TrialFailed as exc:
                    log.warning("profile_failed", job_id=job.job_id, gpus=g, error=str(exc))
                    self.meter.profiles.labels("failed").inc()
                    yield convert.progress(job.job_id, S.PROFILE_STATE_FAILED, g, message=str(exc))
                    return
                yield convert.progress(job.job_id, S.PROFILE_STATE_MEASURED, g,
                                       epoch_seconds=measured[g].epoch_seconds, measured=True)
            profile = _profile(key, measured, top, lambda g: shape.nodes_for(g, kind))
            await self.store.put(profile)
            self.meter.profiles.labels("measured").inc()
            self.meter.profile_seconds.observe(time.monotonic() - began)
            log.info("profile_stored", job_id=job.job_id, key=key.path(), measured=sorted(measured), fit_error=profile.fit_error)
            yield convert.progress(job.job_id, S.PROFILE_STATE_DONE, top, profile=convert.profile(profile))

    async def _trial(self, job, gpus: int, kind: str, full_epoch: bool):
        """Yields wait messages while the trial waits for GPUs, then its StoredPoint."""
        waits: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(self.trials.run(job, gpus, kind, full_epoch, waits.put_nowait))
        began, outcome = time.monotonic(), "failed"
        try:
            while not task.done():
                getter = asyncio.ensure_future(waits.get())
                await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            r = task.result()
            outcome = "measured"
        finally:
            task.cancel()
            if task.done() and not task.cancelled():  # (a trial whose request went away is not counted)
                self.meter.trials.labels(outcome).inc()
                self.meter.trial_seconds.observe(time.monotonic() - began)
        seconds = r.epoch_seconds if full_epoch else fit.epoch_seconds(r.iter_seconds, r.steps)
        yield StoredPoint(gpus=gpus, nodes=r.nodes, epoch_seconds=seconds, measured=True, iter_seconds=r.iter_seconds, steps=r.steps)

    @grpc_errors
    async def GetProfile(self, request, context):
        _, spec = await self._job(request, context)
        problem = validation.text_problem("gpu_kind", request.gpu_kind, MAX_NAME)
        if problem:
            await abort_invalid(context, *problem)
        kind = request.gpu_kind or (await self._shape(context)).main_kind()
        key = convert.key(spec, kind, 1, request.full_epoch)
        found = [p for p in await self.store.family(key) if p.key.full_epoch == request.full_epoch]
        if not found:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"no stored profile for {key.family()} (full_epoch={request.full_epoch})")
        best = max(found, key=lambda p: (len(p.measured()), len(p.points), p.created_unix_s))
        return S.GetProfileResponse(profile=convert.profile(best))


def _profile(key, measured: dict[int, StoredPoint], top: int, nodes_for) -> StoredProfile:
    """Every count 1..top (and each measured one): measured points as they are, the rest fitted
    (on nodes_for(g) nodes, the fewest that hold g GPUs)."""
    points, curve, error = fit.complete({g: p.epoch_seconds for g, p in measured.items()}, top)
    full = tuple(measured[p.gpus] if p.measured else StoredPoint(p.gpus, nodes_for(p.gpus), p.epoch_seconds, False) for p in points)
    return StoredProfile(key=key, points=full, fit=(curve.a, curve.b, curve.c), fit_error=error, created_unix_s=time.time())
