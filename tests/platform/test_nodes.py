"""Node membership: lease-bound node keys, killed nodes vanish within TTL + 1 s."""

from __future__ import annotations

import asyncio
import time

import grpc

from omru.v1 import registry_pb2
from platform_helpers import Collector, claim, register_request, rpc_error

Kind = registry_pb2.ClusterEventKind


async def test_killed_executor_disappears_within_ttl_plus_one_second_and_the_watch_reports_it(registry, registry_stub, start_service):
    ttl = 2
    executor = await start_service("executor", "--port", "0", "--node-id", "node-k", "--registry", registry.address, "--slots", "3", "--ttl", str(ttl))
    listed = await registry_stub.ListNodes(registry_pb2.ListNodesRequest())
    assert [(n.node_id, len(n.gpus), n.gpus[0].kind) for n in listed.nodes] == [("node-k", 3, "cpu")]
    assert listed.nodes[0].address == executor.address
    watch = Collector(registry_stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=listed.revision)))
    await asyncio.sleep(ttl * 1.5)  # heartbeats keep it alive past its TTL
    assert (await registry_stub.GetNode(registry_pb2.GetNodeRequest(node_id="node-k"))).node.node_id == "node-k"

    await asyncio.to_thread(executor.kill)  # SIGKILL: no deregistration, the lease just stops being refreshed
    killed = time.monotonic()
    removed = await watch.wait_for(lambda e: e.kind == Kind.CLUSTER_EVENT_KIND_NODE_REMOVED, timeout=ttl + 3)
    gone_after = time.monotonic() - killed
    assert removed.node.node_id == "node-k"
    assert gone_after <= ttl + 1, f"node vanished {gone_after:.2f} s after the kill (TTL {ttl} s)"
    error = await rpc_error(registry_stub.GetNode(registry_pb2.GetNodeRequest(node_id="node-k")))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    await watch.close()


async def test_cleanly_stopped_executor_deregisters_at_once(registry, registry_stub, start_service):
    executor = await start_service("executor", "--port", "0", "--node-id", "node-c", "--registry", registry.address, "--ttl", "30")
    listed = await registry_stub.ListNodes(registry_pb2.ListNodesRequest())
    watch = Collector(registry_stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=listed.revision)))
    await asyncio.to_thread(executor.stop)  # SIGTERM: revokes its lease (in a thread: the registry serves on this loop)
    # (well within the 30 s TTL, so only the revocation can remove it; a loaded machine may take seconds)
    removed = await watch.wait_for(lambda e: e.kind == Kind.CLUSTER_EVENT_KIND_NODE_REMOVED, timeout=15)
    assert removed.node.node_id == "node-c"
    assert not (await registry_stub.ListNodes(registry_pb2.ListNodesRequest())).nodes
    await watch.close()


async def test_keepalive_with_an_expired_lease_is_not_found_so_the_node_registers_again(registry_stub):
    first = await registry_stub.RegisterNode(register_request("node-e", ttl=1))
    await asyncio.sleep(2.2)
    error = await rpc_error(registry_stub.KeepAliveNode(registry_pb2.KeepAliveNodeRequest(node_id="node-e", lease_id=first.lease_id)))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "node-e" in error.details()
    again = await registry_stub.RegisterNode(register_request("node-e", ttl=5))
    reply = await registry_stub.KeepAliveNode(registry_pb2.KeepAliveNodeRequest(node_id="node-e", lease_id=again.lease_id))
    assert 0 < reply.ttl_seconds <= 5


async def test_registering_again_replaces_the_old_lease_and_its_claims(registry_stub, etcd_store):
    first = await registry_stub.RegisterNode(register_request("node-r"))
    await registry_stub.KeepAliveNode(registry_pb2.KeepAliveNodeRequest(node_id="node-r", lease_id=first.lease_id))
    other = await registry_stub.RegisterNode(register_request("node-s"))
    error = await rpc_error(registry_stub.KeepAliveNode(registry_pb2.KeepAliveNodeRequest(node_id="node-r", lease_id=other.lease_id)))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "is not the lease of node_id 'node-r'" in error.details()
    assert (await claim(etcd_store, "j1", ("node-r", 0))).succeeded
    second = await registry_stub.RegisterNode(register_request("node-r"))
    assert second.lease_id != first.lease_id
    assert not (await registry_stub.ListClaims(registry_pb2.ListClaimsRequest())).claims
    error = await rpc_error(registry_stub.KeepAliveNode(registry_pb2.KeepAliveNodeRequest(node_id="node-r", lease_id=first.lease_id)))
    assert error.code() == grpc.StatusCode.NOT_FOUND
