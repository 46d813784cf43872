"""PlannerService on real etcd and a real registry: submit, validation, idempotence, plan."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from omru.v1 import planner_pb2
from tests.planner_service.planner_helpers import node_request, planner, spec


async def wait_for(cond, timeout=10.0):
    for _ in range(int(timeout / 0.05)):
        if await cond():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_bad_workload_is_rejected_naming_every_problem_and_nothing_is_stored(etcd, registry, registry_stub, etcd_store, free_port):
    await registry_stub.RegisterNode(node_request("n0", 2, free_port()))
    async with planner(etcd.endpoint, registry.address) as (_, d, stub):
        assert await wait_for(lambda: _true(d.live_gpus()))
        bad = planner_pb2.SubmitJobsRequest(jobs=[
            spec("ok"), spec("x", model="no-such-net"), spec("neg", epochs=-2),
            spec("dup", epochs=2), spec("dup", epochs=3), spec("big", min_gpus=3, max_gpus=3)])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SubmitJobs(bad, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        msg = err.value.details()
        for named in ("unknown model 'no-such-net'", "'neg'): epochs: must be >= 1, got -2",
                      "'dup'): job_id given twice in the request with different specs",
                      "'big'): min_gpus: needs 3 GPUs, the cluster has 2"):
            assert named in msg
        kvs, _ = await etcd_store.list("planner/jobs/")
        assert kvs == []


async def test_resubmitting_an_id_is_a_no_op_and_a_changed_spec_is_refused(etcd, registry, registry_stub, etcd_store, free_port):
    await registry_stub.RegisterNode(node_request("n0", 2, free_port()))
    async with planner(etcd.endpoint, registry.address) as (_, d, stub):
        first = await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(jobs=[spec("a"), spec("b")]), timeout=5)
        assert list(first.job_ids) == ["a", "b"]
        before = {kv.key: kv.create_revision for kv in (await etcd_store.list("planner/jobs/"))[0]}
        again = await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(jobs=[spec("a")]), timeout=5)
        assert list(again.job_ids) == ["a"]
        after = {kv.key: kv.create_revision for kv in (await etcd_store.list("planner/jobs/"))[0]}
        assert before == after
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(jobs=[spec("a", epochs=9)]), timeout=5)
        assert "'a'): job_id already submitted with a different spec" in err.value.details()


async def test_an_unknown_policy_is_named(etcd, registry):
    async with planner(etcd.endpoint, registry.address) as (_, _d, stub):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(jobs=[spec("a")], policy="fifo-magic"), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'fifo-magic'" in err.value.details()


async def test_cancelling_an_unknown_job_is_not_found(etcd, registry):
    async with planner(etcd.endpoint, registry.address) as (_, _d, stub):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CancelJob(planner_pb2.CancelJobRequest(job_id="ghost"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "'ghost'" in err.value.details()


async def _true(v):
    return bool(v)


async def test_measured_epoch_times_travel_with_the_jobs_and_the_report_lists_every_job(etcd, registry, registry_stub, free_port):
    from omru import workload
    from omru.client import Client

    await registry_stub.RegisterNode(node_request("n0", 2, free_port()))
    w = workload.parse("jobs:\n  - id: a\n    model: resnet18\n    epochs: 3\n    profile: {1: 4.0, 2: 2.5}\n")
    async with planner(etcd.endpoint, registry.address) as (running, d, _stub):
        async with Client(running.address) as c:
            assert await c.submit(w) == ["a"]
            stored = await d.state.job("a")
            assert stored.profile == {1: 4.0, 2: 2.5}
            rep = await c.report()
            assert [j.job_id for j in rep.jobs] == ["a"]


async def test_measured_placements_are_stored_with_the_profile_and_a_bad_one_is_named(etcd, registry, registry_stub,
                                                                                       free_port):
    await registry_stub.RegisterNode(node_request("n0", 2, free_port()))
    await registry_stub.RegisterNode(node_request("n1", 2, free_port()))

    def request(job_id, *placements):
        return planner_pb2.SubmitJobsRequest(jobs=[spec(job_id)], profiles=[planner_pb2.JobProfile(
            job_id=job_id, epoch_seconds={1: 4.0, 2: 2.5}, placements=[
                planner_pb2.PlacementTime(gpus=g, nodes=k, epoch_seconds=t) for g, k, t in placements])])

    async with planner(etcd.endpoint, registry.address) as (_, d, stub):
        await stub.SubmitJobs(request("a", (2, 2, 3.5)), timeout=5)
        assert (await d.state.job("a")).placement == ((2, 2, 3.5),)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SubmitJobs(request("b", (2, 3, 3.5)), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'b'): profile placement: 3.5 seconds per epoch on 2 GPUs over 3 nodes" in err.value.details()
        assert await d.state.job("b") is None


async def test_a_batch_sent_in_several_calls_is_planned_together(etcd, registry, registry_stub, free_port):
    """A replan waits while a submission is still being handled (past the quiet window's cap), so the
    first plan covers every call of a batch sent in several, not just the first to be stored."""
    from services.planner import dispatcher as dispatch

    def request(*job_ids: str) -> planner_pb2.SubmitJobsRequest:
        return planner_pb2.SubmitJobsRequest(jobs=[spec(j) for j in job_ids], profiles=[
            planner_pb2.JobProfile(job_id=j, epoch_seconds={1: 30.0, 2: 16.0}) for j in job_ids])

    await registry_stub.RegisterNode(node_request("n0", 2, free_port()))
    async with planner(etcd.endpoint, registry.address) as (_, d, stub):
        assert await wait_for(lambda: _true(d.live_gpus()))
        with d.submitting():  # another call of the batch, still being handled
            await stub.SubmitJobs(request("a", "b"), timeout=5)
            await asyncio.sleep(dispatch.REPLAN_QUIET_MAX_S + 1.0)
            assert d.plan_version == 0
            await stub.SubmitJobs(request("c"), timeout=5)
        assert await wait_for(lambda: d.state.first_plan(), timeout=20)
        first = await d.state.first_plan()
        assert {s["job"] for s in first["segments"]} == {"a", "b", "c"}
