"""Profiling trials are allocations like any other (PlannerService.RunTrial), against real etcd, registry,
executor servers and workers: the planner claims the trial's GPUs and writes its allocation (executors
have no way to claim), a job submitted meanwhile waits for them, and bad requests are refused naming the field."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from omru.v1 import common_pb2, executor_pb2, planner_pb2
from services.planner.state import PlannerState
from tests.executor.service_builders import executors
from tests.planner_service.planner_helpers import planner, spec

#: A script trial of a known length: every iteration sleeps SLEEP_S (the trial times 3 after 1 warm-up).
SCRIPT = """import time

from omru import elastic

ctx = elastic.init()
for epoch in ctx.epochs():
    for i, batch in enumerate(ctx.batches(list(range(64)))):
        time.sleep(1.0)
    ctx.report(epoch)
    ctx.save({})
"""
OPTIONS = executor_pb2.ProfileOptions(warmup_iters=1, measure_iters=3)


def script_job(tmp_path, job_id: str = "sleepy") -> common_pb2.JobSpec:
    (tmp_path / "sleepy.py").write_text(SCRIPT)
    return common_pb2.JobSpec(job_id=job_id, command=["python", "sleepy.py"], workdir=str(tmp_path), epochs=1,
                              batch_size=1, base_lr=0.1, base_batch=1)


async def allocations(store) -> dict[str, executor_pb2.Directive]:
    """allocs/<node>/<job> key -> its Directive."""
    from services.registry import convert as keys

    kvs, _ = await store.list(keys.ALLOCS)
    return {kv.key: executor_pb2.Directive.FromString(kv.value) for kv in kvs}


async def until(check, timeout: float = 30.0, every: float = 0.1):
    """The first truthy value of await check() within timeout; AssertionError otherwise."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        value = await check()
        if value:
            return value
        await asyncio.sleep(every)
    raise AssertionError(f"not within {timeout} s")


async def test_a_trial_runs_on_gpus_the_planner_claims_and_a_job_submitted_meanwhile_waits_for_them(
        etcd, etcd_store, registry, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2)) as (ex,), \
            planner(etcd.endpoint, registry.address, str(tmp_path / "ck")) as (_, d, stub):
        state = PlannerState(etcd_store)
        trial = asyncio.ensure_future(stub.RunTrial(planner_pb2.RunTrialRequest(
            job=script_job(tmp_path), gpus=2, profile=OPTIONS), timeout=120))
        claims = await until(state.claims)
        (trial_id,) = set(claims.values())
        assert trial_id.startswith("sleepy.prof-g2-") and sorted(claims) == [("n1", 0), ("n1", 1)]
        allocs = await allocations(etcd_store)
        assert list(allocs) == [f"allocs/n1/{trial_id}"]
        directive = allocs[f"allocs/n1/{trial_id}"]
        assert directive.attempt_id == trial_id and directive.job.job_id == trial_id
        assert directive.HasField("profile") and directive.profile.measure_iters == 3

        # a job submitted while the trial runs is not started on its GPUs
        await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(
            jobs=[spec("j1", epochs=1, max_gpus=2)],
            profiles=[planner_pb2.JobProfile(job_id="j1", epoch_seconds={1: 4.0, 2: 2.5})]), timeout=30)
        for _ in range(20):
            assert set((await state.claims()).values()) <= {trial_id}
            r = d.records.get("j1")
            assert r is None or (not r.gpus and not r.target and r.state in ("PENDING", "WAITING")), r
            if trial.done():
                break
            await asyncio.sleep(0.2)

        result = await trial
        assert result.trial_id == trial_id and (result.gpus, result.nodes) == (2, 1)
        assert result.iter_seconds >= 0.9 and result.steps > 0
        # the trial's allocation and claims are gone; the job then starts on the GPUs
        await until(lambda: asyncio.sleep(0, d.records["j1"].state in ("STARTING", "RUNNING", "FINISHED")))
        claims = await state.claims()
        assert trial_id not in claims.values() and not any(k.endswith(trial_id) for k in await allocations(etcd_store))
        assert (await stub.CancelJob(planner_pb2.CancelJobRequest(job_id="j1"), timeout=30)).state
        job = next(j for j in (await ex.stub.GetJobs(executor_pb2.GetJobsRequest(), timeout=10)).jobs
                   if j.job_id == trial_id)
        assert job.profile and job.phase == "finished"


async def test_a_trial_over_its_deadline_is_stopped_and_its_gpus_come_back(etcd, etcd_store, registry, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 1)) as (ex,), \
            planner(etcd.endpoint, registry.address, str(tmp_path / "ck")) as (_, d, stub):
        request = planner_pb2.RunTrialRequest(job=script_job(tmp_path), gpus=1,
                                              profile=executor_pb2.ProfileOptions(warmup_iters=1, measure_iters=60))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.RunTrial(request, timeout=8)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        state = PlannerState(etcd_store)
        await until(lambda: asyncio.sleep(0, not d.owner), timeout=30)
        assert await state.claims() == {} and await allocations(etcd_store) == {}
        (job,) = (await ex.stub.GetJobs(executor_pb2.GetJobsRequest(), timeout=10)).jobs
        assert job.profile and job.phase == "stopped"


@pytest.mark.parametrize(
    "request_fields, field",
    [
        (dict(gpus=1), "job"),
        (dict(job=spec("x"), gpus=0), "gpus"),
        (dict(job=spec("x"), gpus=3), "gpus"),
        (dict(job=spec("x"), gpus=1, gpu_kind="tpu"), "gpus"),
        (dict(job=spec("bad id!"), gpus=1), "job.job_id"),
        (dict(job=spec("x", model="resnet9000"), gpus=1), "job.model"),
        (dict(job=spec("x"), gpus=1, profile=executor_pb2.ProfileOptions(measure_iters=-1)), "profile.measure_iters"),
    ],
)
async def test_bad_trial_requests_are_refused_naming_the_field_and_write_nothing(etcd, etcd_store, registry,
                                                                                 request_fields, field):
    await registry_node(registry)
    async with planner(etcd.endpoint, registry.address) as (_, d, stub):
        await until(lambda: asyncio.sleep(0, d.nodes))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.RunTrial(planner_pb2.RunTrialRequest(**request_fields), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(field + ":"), err.value.details()
        assert await PlannerState(etcd_store).claims() == {} and await allocations(etcd_store) == {}


async def registry_node(registry) -> None:
    """A node of 2 cpu slots in the registry (no executor: nothing may run on it)."""
    from omru.v1 import registry_pb2_grpc
    from services.common.channels import open_channel
    from tests.planner_service.planner_helpers import node_request

    async with open_channel(registry.address) as channel:
        await registry_pb2_grpc.RegistryServiceStub(channel).RegisterNode(node_request("n1", 2, 1), timeout=10)



async def test_a_trial_spread_over_two_nodes_measures_on_both(etcd, etcd_store, registry, tmp_path):
    from tests.profiler.profiler_helpers import tiny_job

    async with executors(registry.address, tmp_path, ("n1", 1), ("n2", 1)), \
            planner(etcd.endpoint, registry.address, str(tmp_path / "ck")) as (_, d, stub):
        await until(lambda: asyncio.sleep(0, len(d.nodes) == 2))
        result = await stub.RunTrial(planner_pb2.RunTrialRequest(job=tiny_job("spread"), gpus=2, profile=OPTIONS),
                                     timeout=120)
        assert (result.gpus, result.nodes) == (2, 2) and result.iter_seconds > 0 and result.steps == 64 // 16
        assert await PlannerState(etcd_store).claims() == {} and await allocations(etcd_store) == {}
        # rank 0 published its port in the trial's folder under the checkpoint root, removed afterwards
        assert await until(lambda: asyncio.sleep(0, not list((tmp_path / "ck" / "trials").glob("*"))))


async def test_a_planner_that_takes_over_ends_the_trials_of_the_one_before(etcd, etcd_store, registry, tmp_path):
    """A trial whose planner died (its claims and allocation in etcd, its workers running): the next planner
    removes the allocation, the executor stops the trial, and the claims go once it released the GPUs."""
    from omru.v1 import registry_pb2, registry_pb2_grpc
    from services.common.channels import open_channel

    async with executors(registry.address, tmp_path, ("n1", 1)) as (ex,):
        async with open_channel(registry.address) as channel:
            (node,) = (await registry_pb2_grpc.RegistryServiceStub(channel).ListNodes(
                registry_pb2.ListNodesRequest(), timeout=10)).nodes
        trial_id = "sleepy.prof-g1-0123abcd"
        job = script_job(tmp_path, trial_id)
        directive = executor_pb2.Directive(
            directive_id=f"{trial_id}.start", kind=executor_pb2.DIRECTIVE_KIND_START, job=job,
            gpus=[common_pb2.GpuRef(node_id="n1", index=0)], attempt_id=trial_id,
            profile=executor_pb2.ProfileOptions(warmup_iters=1, measure_iters=60))
        state = PlannerState(etcd_store)
        assert (await state.change(trial_id, claim={("n1", 0): node.lease_id},
                                   put={"n1": (directive.SerializeToString(), node.lease_id)})).succeeded
        events = ex.events()
        try:
            await events.wait_for(lambda e: e.job_id == trial_id and e.kind == executor_pb2.EXECUTOR_EVENT_KIND_STARTED,
                                  timeout=60)
            async with planner(etcd.endpoint, registry.address, str(tmp_path / "ck")) as (_, d, _stub):
                await until(lambda: asyncio.sleep(0, not d.owner), timeout=60)
                assert await state.claims() == {} and await allocations(etcd_store) == {}
                await events.wait_for(lambda e: e.job_id == trial_id
                                      and e.kind == executor_pb2.EXECUTOR_EVENT_KIND_GPUS_RELEASED, timeout=5)
                assert (await ex.job(trial_id)).phase == "stopped"
        finally:
            events.close()


async def test_a_job_whose_id_ends_like_a_trials_is_refused_at_submission(etcd, etcd_store, registry):
    """The planner routes a trial's events by its id: a job may not take that shape."""
    await registry_node(registry)
    async with planner(etcd.endpoint, registry.address) as (_, d, stub):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(
                jobs=[spec("mine.prof-g2-0123abcd")],
                profiles=[planner_pb2.JobProfile(job_id="mine.prof-g2-0123abcd", epoch_seconds={1: 3.0})]), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "jobs[0] ('mine.prof-g2-0123abcd'): job_id: ends like a profiling trial's id" in err.value.details()
        assert (await etcd_store.list("planner/jobs/"))[0] == []
        # a dot and the word alone are fine
        await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(
            jobs=[spec("mine.prof-run")], profiles=[planner_pb2.JobProfile(job_id="mine.prof-run",
                                                                           epoch_seconds={1: 3.0})]), timeout=10)
