"""Two planners on one etcd: one leads and writes, the other waits on standby and takes over."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from omru.v1 import planner_pb2, planner_pb2_grpc
from services.common.channels import open_channel
from tests.planner_service.planner_helpers import spec

TTL = 2


async def submit(stub, job_id: str):
    return await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(jobs=[spec(job_id)], profiles=[
        planner_pb2.JobProfile(job_id=job_id, epoch_seconds={1: 3.0})]), timeout=5)


async def until_accepted(stub, job_id: str, within: float) -> float:
    """Seconds until the planner accepted a submission (it leads)."""
    began = time.monotonic()
    while True:
        try:
            await submit(stub, job_id)
            return time.monotonic() - began
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
            if time.monotonic() - began > within:
                raise
        await asyncio.sleep(0.1)


async def leader_and_standby(etcd, registry, start_service):
    """Two planner processes on one etcd, the first leading (it took job 'one'); (process, stub) of each."""
    args = ("--port", "0", "--etcd", etcd.endpoint, "--registry", registry.address, "--profiler", "127.0.0.1:1",
            "--leader-ttl", str(TTL))
    first = await start_service("planner", *args)
    a = planner_pb2_grpc.PlannerServiceStub(open_channel(first.address))
    await until_accepted(a, "one", within=10)
    second = await start_service("planner", *args)
    return (first, a), (second, planner_pb2_grpc.PlannerServiceStub(open_channel(second.address)))


async def test_only_the_leading_planner_writes_and_a_standby_takes_over_within_the_lease(etcd, registry, etcd_store,
                                                                                          start_service):
    (first, _), (second, b) = await leader_and_standby(etcd, registry, start_service)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(b, "two")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f":{first.address.rpartition(':')[2]} pid {first.proc.pid}" in err.value.details()
    assert "standby" in err.value.details()
    first.kill()  # no resignation: its lease has to lapse
    assert await until_accepted(b, "two", within=TTL + 5) < TTL + 2
    kvs, _ = await etcd_store.list("planner/jobs/")
    assert [kv.key for kv in kvs] == ["planner/jobs/one", "planner/jobs/two"]
    assert (await etcd_store.get("planner/leader")).value.decode().endswith(f"pid {second.proc.pid}")


async def test_a_leader_paused_past_its_lease_is_deposed_and_stands_by_when_it_resumes(etcd, registry,
                                                                                        start_service):
    import os
    import signal

    (first, a), (second, b) = await leader_and_standby(etcd, registry, start_service)
    os.kill(first.proc.pid, signal.SIGSTOP)
    try:
        await until_accepted(b, "two", within=TTL + 5)
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
    # whatever it writes is fenced off; it notices its lease is gone and stands by, naming the new leader
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(a, "three")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    began = time.monotonic()
    while f"pid {second.proc.pid}" not in err.value.details() and time.monotonic() - began < TTL + 5:
        await asyncio.sleep(0.2)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await submit(a, "three")
    assert "standby" in err.value.details() and f"pid {second.proc.pid}" in err.value.details()
    await submit(b, "three")
    assert first.proc.poll() is None  # still serving, on standby


async def test_a_write_to_a_planner_just_elected_waits_for_it_to_load_its_state(etcd, registry, etcd_store):
    """Elected, the planner loads its state before it acts; a write meanwhile waits instead of bouncing."""
    from services.common import config as cfg
    from services.common.etcd import Election, EtcdStore
    from services.planner.dispatcher import Dispatcher
    from services.planner.server import start
    from services.planner.servicer import PlannerServicer
    from services.planner.state import LEADER, PlannerState

    class SlowState(PlannerState):
        async def jobs(self):
            await asyncio.sleep(1.5)
            return await super().jobs()

    store = EtcdStore(etcd.endpoint)
    await store.connect()
    d = Dispatcher(SlowState(store), registry.address, profiler="127.0.0.1:1")
    config = cfg.PlannerConfig(server=cfg.ServerConfig(port=0), etcd=cfg.EtcdConfig(endpoint=etcd.endpoint),
                               registry=registry.address, profiler="127.0.0.1:1")
    running = await start(config, PlannerServicer(d))
    d.standby_of = Election(store, LEADER, "this planner", TTL)
    channel = open_channel(running.address)
    try:
        await d.standby_of.campaign()
        starting = asyncio.create_task(d.start())
        await asyncio.sleep(0.2)
        assert not d.leading
        began = time.monotonic()
        await submit(planner_pb2_grpc.PlannerServiceStub(channel), "one")
        assert d.leading and time.monotonic() - began > 0.5
        await starting
        assert (await etcd_store.get("planner/jobs/one")) is not None
    finally:
        await channel.close()
        await d.stop()
        await running.stop(0)
        await d.standby_of.resign()
        await store.close()
