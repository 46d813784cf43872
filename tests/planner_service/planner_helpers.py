"""Builders for planner-service tests: an in-process planner on real etcd + registry."""

from __future__ import annotations

import contextlib

from omru.v1 import common_pb2, registry_pb2


def spec(job_id: str, model: str = "resnet18", epochs: int = 2, **kw) -> common_pb2.JobSpec:
    base = dict(job_id=job_id, model=model, dataset="digits", epochs=epochs, batch_size=16, base_lr=0.05,
                base_batch=16, image_size=8, train_samples=64)
    base.update(kw)
    return common_pb2.JobSpec(**base)


def node_request(node_id: str, slots: int, port: int, ttl: int = 30) -> registry_pb2.RegisterNodeRequest:
    return registry_pb2.RegisterNodeRequest(
        node_id=node_id, address=f"127.0.0.1:{port}", ttl_seconds=ttl,
        gpus=[common_pb2.GpuInfo(index=i, kind="cpu") for i in range(slots)])


@contextlib.asynccontextmanager
async def planner(etcd_endpoint: str, registry_address: str, checkpoint_root: str = "", **dispatcher_kw):
    """(RunningServer, Dispatcher, PlannerServiceStub) of an in-process planner on port 0."""
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
    d = Dispatcher(PlannerState(store), registry_address, profiler="127.0.0.1:1", checkpoint_root=checkpoint_root,
                   **dispatcher_kw)
    config = cfg.PlannerConfig(server=cfg.ServerConfig(port=0), etcd=cfg.EtcdConfig(endpoint=etcd_endpoint),
                               registry=registry_address, profiler="127.0.0.1:1")
    running = await start(config, PlannerServicer(d))
    await d.start()
    channel = open_channel(running.address)
    try:
        yield running, d, planner_pb2_grpc.PlannerServiceStub(channel)
    finally:
        await channel.close()
        await d.stop()
        await running.stop(0)
        await store.close()
