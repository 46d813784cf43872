"""ProfilerService against real etcd, registry, executor servers and gloo
workers: trials run through the executors, profiles are stored and reused,
bad requests are refused naming the field, a crashing trial is a failed
profile that is never stored."""

from __future__ import annotations

import grpc
import pytest

from omru.v1 import executor_pb2
from tests.executor.service_builders import K, executors
from tests.profiler.profiler_helpers import P, points, profile, profiler, tiny_job


async def last_seq(ex) -> int:
    return (await ex.stub.GetJobs(executor_pb2.GetJobsRequest(), timeout=10)).last_seq


async def test_profile_measures_each_count_through_executors_then_serves_the_store(etcd, registry, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2)) as (ex,), profiler(etcd.endpoint, registry.address) as stub:
        events = ex.events()
        steps = await profile(stub, tiny_job())
        assert [s.state for s in steps] == [P.PROFILE_STATE_MEASURING, P.PROFILE_STATE_MEASURED] * 2 + [P.PROFILE_STATE_DONE]
        done = steps[-1]
        assert not done.cached
        assert sorted(points(done)) == [1, 2] and all(m for _, m in points(done).values())
        profiled = [e for e in events.items if e.kind == K.EXECUTOR_EVENT_KIND_PROFILED]
        assert sorted(e.world_size for e in profiled) == [1, 2]
        for e in profiled:  # epoch seconds = steady-state iteration time x iterations per epoch
            measured = points(done)[e.world_size][0]
            assert measured == pytest.approx(e.iter_seconds * e.steps)
            assert e.steps == 64 // (8 * e.world_size)
        assert done.profile.key.model == "mobilenet_v3_small" and done.profile.key.input_shape == "3x16x16"
        assert (done.profile.key.batch_size, done.profile.key.gpu_kind, done.profile.key.nodes) == (8, "cpu", 1)

        seq = await last_seq(ex)
        again = await profile(stub, tiny_job("p2"))  # another job, same configuration
        assert [s.state for s in again] == [P.PROFILE_STATE_DONE] and again[0].cached
        assert points(again[0]) == points(done)
        assert await last_seq(ex) == seq, "a cached profile must not run a trial"

        got = await stub.GetProfile(P.GetProfileRequest(job=tiny_job("p3")), timeout=10)
        assert {p.gpus: p.epoch_seconds for p in got.profile.points} == {g: t for g, (t, _) in points(done).items()}

        fresh = await profile(stub, tiny_job(), gpu_counts=[1], max_gpus=1, refresh=True)
        assert [s.state for s in fresh][-1] == P.PROFILE_STATE_DONE and not fresh[-1].cached
        assert await last_seq(ex) > seq, "refresh must measure again"
        events.close()


async def test_counts_not_measured_are_fitted_and_say_so(etcd, registry, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 3)) as _, profiler(etcd.endpoint, registry.address) as stub:
        done = (await profile(stub, tiny_job(train_samples=48), max_gpus=3))[-1]
        assert done.state == P.PROFILE_STATE_DONE
        assert {g: m for g, (_, m) in points(done).items()} == {1: True, 2: True, 3: False}
        curve = done.profile.fit
        assert points(done)[3][0] == pytest.approx(curve.a + curve.b / 3 + curve.c * 2)
        assert done.profile.fit_error >= 0


@pytest.mark.parametrize(
    "job, fields, field",
    [
        (tiny_job(model="resnet9000"), {}, "job.model"),
        (tiny_job(dataset="mnist"), {}, "job.dataset"),
        (tiny_job(batch_size=0), {}, "job.batch_size"),
        (tiny_job(), {"gpu_counts": [1, 3]}, "gpu_counts[1]"),
        (tiny_job(), {"max_gpus": 5}, "max_gpus"),
    ],
)
async def test_bad_requests_are_refused_naming_the_field_and_run_nothing(etcd, registry, tmp_path, job, fields, field):
    async with executors(registry.address, tmp_path, ("n1", 2)) as (ex,), profiler(etcd.endpoint, registry.address) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await profile(stub, job, timeout=30, **fields)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(field + ":"), err.value.details()
        assert await last_seq(ex) == 0


async def test_a_crashing_trial_is_a_failed_profile_and_is_never_stored(etcd, registry, tmp_path):
    job = tiny_job(dataset=f"imagefolder:{tmp_path / 'no-such-folder'}")
    async with executors(registry.address, tmp_path, ("n1", 2)) as (ex,), profiler(etcd.endpoint, registry.address) as stub:
        steps = await profile(stub, job, timeout=120)
        assert steps[-1].state == P.PROFILE_STATE_FAILED and steps[-1].gpus == 1
        assert "no-such-folder" in steps[-1].message or "failed" in steps[-1].message
        assert P.PROFILE_STATE_DONE not in [s.state for s in steps]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetProfile(P.GetProfileRequest(job=job), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_sampled_estimate_and_a_full_epoch_measurement_are_kept_apart(etcd, registry, tmp_path):
    # How close the two are is a timing: bench/profile_accuracy.py prints it (target 10 %); a bound here
    # fails on a busy machine. This checks what each method is: the sampled one times steady iterations
    # and scales them to the epoch's, the full one times the epoch; each is stored under its own key.
    job = tiny_job("acc", train_samples=128)  # 16 iterations of 8 samples per epoch
    async with executors(registry.address, tmp_path, ("n1", 1)) as _, profiler(etcd.endpoint, registry.address) as stub:
        for full_epoch in (False, True):
            done = (await profile(stub, job, max_gpus=1, full_epoch=full_epoch, refresh=True))[-1]
            assert done.state == P.PROFILE_STATE_DONE and done.profile.key.full_epoch == full_epoch
            (point,) = done.profile.points
            assert point.measured and point.steps == 16 and point.iter_seconds > 0 and point.epoch_seconds > 0
            if not full_epoch:
                assert point.epoch_seconds == pytest.approx(point.iter_seconds * point.steps)
        for full_epoch in (False, True):
            stored = await stub.GetProfile(P.GetProfileRequest(job=job, full_epoch=full_epoch), timeout=10)
            assert stored.profile.key.full_epoch == full_epoch


async def test_a_count_spanning_nodes_runs_one_trial_across_both_executors(etcd, registry, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 1), ("n2", 1)) as (a, b), \
            profiler(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ck")) as stub:
        on_a, on_b = a.events(), b.events()
        done = (await profile(stub, tiny_job("span"), gpu_counts=[2]))[-1]
        assert done.state == P.PROFILE_STATE_DONE, done.message
        two = next(p for p in done.profile.points if p.gpus == 2)
        assert two.measured and two.nodes == 2 and done.profile.key.nodes == 2
        for events in (on_a, on_b):  # each node hosted one rank and gave its slot back
            assert [e.kind for e in events.items if e.world_size == 2 and e.kind == K.EXECUTOR_EVENT_KIND_GPUS_RELEASED]
        profiled = [e for e in on_a.items + on_b.items if e.kind == K.EXECUTOR_EVENT_KIND_PROFILED and e.world_size == 2]
        assert [e.steps for e in profiled] == [two.steps]  # reported once, by rank 0's node
        on_a.close(), on_b.close()


async def test_a_trial_waits_queued_while_its_gpus_are_taken_then_runs(etcd, etcd_store, registry, tmp_path):
    from services.planner.state import PlannerState
    from tests.platform.platform_helpers import claim

    async with executors(registry.address, tmp_path, ("n1", 2)) as _, profiler(etcd.endpoint, registry.address) as stub:
        assert (await claim(etcd_store, "other", ("n1", 1))).succeeded  # (as the planner claims for a job)
        call = stub.Profile(P.ProfileRequest(job=tiny_job("q"), gpu_counts=[2]), timeout=240)
        steps = []
        async for reply in call:
            steps.append(reply.progress)
            if reply.progress.state == P.PROFILE_STATE_QUEUED:
                assert reply.progress.gpus == 2 and "free" in reply.progress.message
                assert (await PlannerState(etcd_store).change("other", release=[("n1", 1)])).succeeded
        states = [s.state for s in steps]
        assert P.PROFILE_STATE_QUEUED in states and states[-1] == P.PROFILE_STATE_DONE
