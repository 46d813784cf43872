"""PlannerService.ListJobs on real etcd and a real registry: every job, filters, bad filters, a standby."""

from __future__ import annotations

import asyncio
import contextlib
import json

import grpc
import pytest

from omru.v1 import common_pb2, planner_pb2
from tests.planner_service.planner_helpers import planner, spec

S = common_pb2


def _request(*job_ids: str) -> planner_pb2.SubmitJobsRequest:
    """Jobs with measured epoch times (not profiled: no profiler runs here)."""
    return planner_pb2.SubmitJobsRequest(jobs=[spec(j) for j in job_ids], profiles=[
        planner_pb2.JobProfile(job_id=j, epoch_seconds={1: 3.0}) for j in job_ids])


async def _listed(stub, **filters) -> list[tuple[str, int]]:
    reply = await stub.ListJobs(planner_pb2.ListJobsRequest(**filters), timeout=5)
    return [(u.job_id, u.state) for u in reply.jobs]


async def test_list_jobs_returns_every_job_and_filters_by_state_and_id(etcd, registry):
    async with planner(etcd.endpoint, registry.address) as (_, d, stub):
        assert (await stub.ListJobs(planner_pb2.ListJobsRequest(), timeout=5)) == planner_pb2.ListJobsResponse()
        await stub.SubmitJobs(_request("c", "a", "b"), timeout=5)
        await stub.CancelJob(planner_pb2.CancelJobRequest(job_id="b"), timeout=5)

        for _ in range(50):  # (a read between two equal reads of etcd: the planner may move a job meanwhile)
            before = await d.state.jobs()
            reply = await stub.ListJobs(planner_pb2.ListJobsRequest(), timeout=5)
            if await d.state.jobs() == before:
                break
        stored = {r.job_id: r for r in before}
        assert [u.job_id for u in reply.jobs] == ["a", "b", "c"]  # every job, by job_id
        for u in reply.jobs:  # the JobUpdate WatchJobs streams for the same record
            r = stored[u.job_id]
            assert u.state == S.JobState.Value(f"JOB_STATE_{r.state}") and u.revision == r.revision
            assert u.epochs == 2 and u.plan_version == d.plan_version
        assert reply.revision == max(r.revision for r in stored.values())
        states = dict((u.job_id, u.state) for u in reply.jobs)
        assert states["b"] == S.JOB_STATE_CANCELLED and states["a"] != S.JOB_STATE_CANCELLED

        assert await _listed(stub, states=[S.JOB_STATE_CANCELLED]) == [("b", S.JOB_STATE_CANCELLED)]
        assert await _listed(stub, states=[S.JOB_STATE_FINISHED]) == []
        live = [s for s in S.JobState.values() if s not in (S.JOB_STATE_UNSPECIFIED, S.JOB_STATE_CANCELLED)]
        assert [j for j, _ in await _listed(stub, states=live)] == ["a", "c"]
        assert [j for j, _ in await _listed(stub, states=[S.JOB_STATE_CANCELLED, *live])] == ["a", "b", "c"]
        assert [j for j, _ in await _listed(stub, job_ids=["c", "a", "ghost"])] == ["a", "c"]
        assert await _listed(stub, job_ids=["a", "b"], states=[S.JOB_STATE_CANCELLED]) == [("b", S.JOB_STATE_CANCELLED)]

        # WatchJobs from the list's revision streams what changed after it, and nothing before
        watch = stub.WatchJobs(planner_pb2.WatchJobsRequest(after_revision=reply.revision))
        try:
            await stub.CancelJob(planner_pb2.CancelJobRequest(job_id="a"), timeout=5)
            while True:
                update = (await asyncio.wait_for(watch.read(), 5)).update
                assert update.revision > reply.revision
                if (update.job_id, update.state) == ("a", S.JOB_STATE_CANCELLED):
                    break
        finally:
            watch.cancel()


@pytest.mark.parametrize("filters,named", [
    (dict(states=[42]), "states[0]: 42 is not a job state"),
    (dict(states=[S.JOB_STATE_RUNNING, S.JOB_STATE_UNSPECIFIED]), "states[1]: 0 is not a job state"),
    (dict(job_ids=["a", ""]), "job_ids[1]: is required"),
    (dict(job_ids=["bad id!"]), "job_ids[0]: 'bad id!' is not a valid id"),
])
async def test_a_bad_filter_is_invalid_naming_it(etcd, registry, filters, named):
    async with planner(etcd.endpoint, registry.address) as (_, _d, stub):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ListJobs(planner_pb2.ListJobsRequest(**filters), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert named in err.value.details()


@contextlib.asynccontextmanager
async def _standby(etcd_endpoint: str, registry_address: str):
    """A PlannerServiceStub to a planner that serves but never started leading (on standby)."""
    from omru.v1 import planner_pb2_grpc
    from services.common import config as cfg
    from services.common.channels import open_channel
    from services.common.etcd import EtcdStore
    from services.planner.dispatcher import Dispatcher
    from services.planner.server import start
    from services.planner.servicer import PlannerServicer
    from services.planner.state import PlannerState

    store = EtcdStore(etcd_endpoint)
    await store.connect()
    d = Dispatcher(PlannerState(store), registry_address, profiler="127.0.0.1:1")
    config = cfg.PlannerConfig(server=cfg.ServerConfig(port=0), etcd=cfg.EtcdConfig(endpoint=etcd_endpoint),
                               registry=registry_address, profiler="127.0.0.1:1")
    running = await start(config, PlannerServicer(d))
    channel = open_channel(running.address)
    try:
        assert not d.leading
        yield planner_pb2_grpc.PlannerServiceStub(channel)
    finally:
        await channel.close()
        await running.stop(0)
        await store.close()


async def test_a_standby_planner_lists_the_jobs_the_leader_stored(etcd, registry):
    async with planner(etcd.endpoint, registry.address) as (_, _d, leader):
        await leader.SubmitJobs(_request("x", "y"), timeout=5)
        async with _standby(etcd.endpoint, registry.address) as standby:
            with pytest.raises(grpc.aio.AioRpcError) as err:  # it does not write
                await standby.SubmitJobs(_request("z"), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert [j for j, _ in await _listed(standby)] == ["x", "y"]


async def test_the_sdk_and_omru_status_list_jobs_through_list_jobs(etcd, registry, capsys):
    from omru import errors
    from omru.cli.main import main
    from omru.client import Client

    async with planner(etcd.endpoint, registry.address) as (running, _d, stub):
        await stub.SubmitJobs(_request("p", "q"), timeout=5)
        await stub.CancelJob(planner_pb2.CancelJobRequest(job_id="q"), timeout=5)
        async with Client(running.address) as c:
            assert [j.job_id for j in await c.status()] == ["p", "q"]
            assert [(j.job_id, j.state) for j in await c.list_jobs(states=["cancelled"])] == [("q", "CANCELLED")]
            assert [j.job_id for j in await c.list_jobs(states=[S.JOB_STATE_CANCELLED], job_ids=["p"])] == []
            with pytest.raises(errors.InvalidArgument, match="'bogus'"):
                await c.list_jobs(states=["bogus"])
            with pytest.raises(errors.InvalidArgument) as err:
                await c.list_jobs(states=[99])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "states[0]: 99" in err.value.details()

        capsys.readouterr()
        rc = await asyncio.to_thread(main, ["status", "--planner", running.address, "--state", "CANCELLED", "--json"])
        assert rc == 0
        assert [j["job_id"] for j in json.loads(capsys.readouterr().out)["jobs"]] == ["q"]
        rc = await asyncio.to_thread(main, ["status", "--planner", running.address, "--state", "bogus"])
        assert rc == 2 and "--state: unknown job state 'bogus'" in capsys.readouterr().err


async def test_a_job_record_stores_its_spec_once_and_reads_back_whole(etcd_store):
    """A record's spec, profile and placements (most of its bytes) are written at submission and when
    they change, not with every epoch; reads join the two keys; a record stored whole still reads."""
    from dataclasses import replace

    from services.planner import state as st

    state = st.PlannerState(etcd_store)
    r = st.JobRecord(spec={"job_id": "j", "epochs": 9}, max_gpus=4, profile={1: 20.0, 2: 11.0, 4: 6.0},
                     placement=((4, 2, 7.5),), submitted_s=1.0, state=st.RUNNING)
    assert (await state.create_jobs([r]))[0]
    spec_revision = (await etcd_store.get(st.SPECS + "j")).mod_revision
    for epoch in range(1, 4):
        r = await state.update_job("j", lambda c: replace(c, state=st.RUNNING, epochs_done=epoch))
    assert (await etcd_store.get(st.SPECS + "j")).mod_revision == spec_revision
    assert b"profile" not in (await etcd_store.get(st.JOBS + "j")).value
    assert await state.job("j") == r and (await state.jobs()) == [r]
    assert r.epochs_done == 3 and r.profile == {1: 20.0, 2: 11.0, 4: 6.0} and r.placement == ((4, 2, 7.5),)

    # a new profile is written with the change that brings it, in the same transaction
    r = await state.update_job("j", lambda c: replace(c, profile={1: 19.0}, epochs_done=4))
    assert (await etcd_store.get(st.SPECS + "j")).mod_revision == r.revision
    # as is one a fresh PlannerState (a planner that took over) has not seen stored
    other = st.PlannerState(etcd_store)
    assert (await other.change("j", record=replace(r, max_gpus=2))).succeeded
    assert (await state.job("j")).max_gpus == 2

    # a record stored whole (before specs had their own key) reads as it was
    old = replace(r, spec={"job_id": "old", "epochs": 2}, revision=0)
    await etcd_store.put(st.JOBS + "old", old.to_json())
    back = await state.job("old")
    assert replace(back, revision=0) == old


def test_the_transition_table_names_every_job_state_of_the_proto():
    """One table of job-state moves, its states those of omru.v1.JobState; terminal ones lead nowhere."""
    from omru.v1 import common_pb2
    from services.planner import state as st

    names = {n.removeprefix("JOB_STATE_") for n in common_pb2.JobState.keys()} - {"UNSPECIFIED"}
    assert set(st.MOVES) == names
    assert all(to <= names for to in st.MOVES.values())
    assert {s for s, to in st.MOVES.items() if not to} == st.TERMINAL


async def test_a_write_that_moves_a_job_against_the_table_is_refused_and_stores_nothing(etcd_store):
    from dataclasses import replace

    from services.planner import state as st

    state = st.PlannerState(etcd_store)
    r = st.JobRecord(spec={"job_id": "j", "epochs": 2}, max_gpus=1, profile={1: 5.0}, submitted_s=1.0)
    assert (await state.create_jobs([r]))[0]
    with pytest.raises(st.IllegalMove, match="'j' cannot move from PENDING to RUNNING"):
        await state.update_job("j", lambda c: replace(c, state=st.RUNNING))
    for to in (st.WAITING, st.STARTING, st.RUNNING, st.RUNNING, st.FINISHED):
        r = await state.update_job("j", lambda c: replace(c, state=to, epochs_done=c.epochs_done + 1))
    assert r.state == st.FINISHED
    with pytest.raises(st.IllegalMove, match="from FINISHED to RUNNING"):
        await state.change("j", record=replace(r, state=st.RUNNING))
    with pytest.raises(st.IllegalMove, match="from FINISHED to WAITING"):
        await state.update_job("j", lambda c: replace(c, state=st.WAITING))
    assert await state.job("j") == r
