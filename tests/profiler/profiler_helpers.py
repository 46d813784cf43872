"""Builders for the profiler tests: an in-process profiler server on the test
etcd and registry with the planner that runs its trials (the leader the
profiler finds in etcd), a stub to it, tiny jobs, and a helper that drains a
Profile stream."""

from __future__ import annotations

import contextlib

from omru.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc
from services.common import config as cfg
from services.common.channels import open_channel

P = profiler_pb2


def tiny_job(job_id: str = "p1", **overrides) -> common_pb2.JobSpec:
    """A job whose trial takes a few seconds on one CPU core."""
    fields = dict(job_id=job_id, model="mobilenet_v3_small", dataset="synthetic", epochs=1, batch_size=8,
                  base_lr=0.05, num_classes=4, image_size=16, train_samples=64, seed=3)
    fields.update(overrides)
    return common_pb2.JobSpec(**fields)


@contextlib.asynccontextmanager
async def planner_for(etcd_endpoint: str, registry_address: str, profiler_address: str = "127.0.0.1:1",
                      **config_fields):
    """A real planner server (port 0, elected leader: the profiler finds it by its leader key); its
    RunningServer. The dispatcher is `running.dispatcher`."""
    import asyncio

    from services.common.etcd import EtcdStore
    from services.planner import server
    from services.planner.state import LEADER

    config = cfg.PlannerConfig(server=cfg.ServerConfig(port=0), etcd=cfg.EtcdConfig(endpoint=etcd_endpoint),
                               registry=registry_address, profiler=profiler_address, **config_fields)
    running = await server.start(config)
    try:
        store = EtcdStore(etcd_endpoint)
        await store.connect()
        try:  # elected (its identity names its address) before a trial is asked of it
            for _ in range(200):
                kv = await store.get(LEADER)
                if kv is not None and kv.value.decode().startswith(f"{running.address} pid "):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the planner was not elected")
        finally:
            await store.close()
        yield running
    finally:
        await running.stop(0)


@contextlib.asynccontextmanager
async def profiler(etcd_endpoint: str, registry_address: str, keep_address: bool = False, **planner_fields):
    """A ProfilerServiceStub to a real profiler server (port 0), with a real planner to run its trials;
    (stub, address) with keep_address."""
    from services.profiler import server

    config = cfg.ProfilerConfig(etcd=cfg.EtcdConfig(endpoint=etcd_endpoint), registry=registry_address)
    running = await server.start(config)
    channel = open_channel(running.address)
    try:
        async with planner_for(etcd_endpoint, registry_address, running.address, **planner_fields):
            stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
            yield (stub, running.address) if keep_address else stub
    finally:
        await channel.close()
        await running.stop(0)


async def profile(stub, job: common_pb2.JobSpec, timeout: float = 240, **fields) -> list[profiler_pb2.ProfileProgress]:
    """Every progress step of one Profile call."""
    call = stub.Profile(P.ProfileRequest(job=job, **fields), timeout=timeout)
    return [reply.progress async for reply in call]


def points(progress: profiler_pb2.ProfileProgress) -> dict[int, tuple[float, bool]]:
    return {p.gpus: (p.epoch_seconds, p.measured) for p in progress.profile.points}
