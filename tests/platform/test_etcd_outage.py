"""etcd stopped and restarted: UNAVAILABLE meanwhile, serving again afterwards without a restart."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from omru.v1 import registry_pb2
from platform_helpers import Collector, claim, register_request, rpc_error
from services.common.etcd import EtcdUnavailable


async def _until_serving(call_factory, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call_factory()
        except (grpc.aio.AioRpcError, EtcdUnavailable) as exc:
            down = isinstance(exc, EtcdUnavailable) or exc.code() == grpc.StatusCode.UNAVAILABLE
            if not down or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_registry_answers_unavailable_while_etcd_is_down_and_serves_again_after_restart(etcd, etcd_store,
                                                                                                registry_stub):
    node = await registry_stub.RegisterNode(register_request("node-o", ttl=60))
    assert (await registry_stub.KeepAliveNode(registry_pb2.KeepAliveNodeRequest(
        node_id="node-o", lease_id=node.lease_id), timeout=10)).ttl_seconds > 0
    assert (await claim(etcd_store, "kept", ("node-o", 0))).succeeded
    listed = await registry_stub.ListClaims(registry_pb2.ListClaimsRequest())
    watch = Collector(registry_stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=listed.revision)))

    await asyncio.to_thread(etcd.stop)
    for call in (
        registry_stub.ListNodes(registry_pb2.ListNodesRequest()),
        registry_stub.ListClaims(registry_pb2.ListClaimsRequest(job_id="kept")),
    ):
        error = await rpc_error(call)
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert etcd.endpoint in error.details()
    with pytest.raises(EtcdUnavailable):  # (the planner's claims too)
        await claim(etcd_store, "during", ("node-o", 1))

    keepalive = await rpc_error(registry_stub.KeepAliveNode(registry_pb2.KeepAliveNodeRequest(
        node_id="node-o", lease_id=node.lease_id), timeout=10))
    assert keepalive.code() == grpc.StatusCode.UNAVAILABLE

    await asyncio.to_thread(etcd.start)  # same ports, same data
    # the lease keep-alive stream that broke is opened again
    renewed = await _until_serving(lambda: registry_stub.KeepAliveNode(registry_pb2.KeepAliveNodeRequest(
        node_id="node-o", lease_id=node.lease_id), timeout=10))
    assert renewed.ttl_seconds > 0
    claims = await _until_serving(lambda: registry_stub.ListClaims(registry_pb2.ListClaimsRequest()))
    assert [c.job_id for c in claims.claims] == ["kept"]
    assert (await registry_stub.GetNode(registry_pb2.GetNodeRequest(node_id="node-o"))).node.node_id == "node-o"
    after = (await _until_serving(lambda: claim(etcd_store, "after", ("node-o", 1)))).revision
    event = await watch.wait_for(lambda e: e.revision == after, timeout=15)  # the open watch resumed by itself
    assert event.claim.job_id == "after"
    assert watch.error is None
    await watch.close()
