"""WatchCluster: one response per etcd revision, resumable without gaps."""

from __future__ import annotations

import asyncio

from conftest import start_registry

from omru.v1 import registry_pb2, registry_pb2_grpc
from platform_helpers import Collector, claim, register_request
from services.common.channels import open_channel
from services.planner.state import PlannerState

Kind = registry_pb2.ClusterEventKind


async def _write(stub, store, i: int) -> int:
    """One write of cluster state (a node registers, the planner claims or releases a GPU); its etcd revision."""
    if i % 3 == 0:
        return (await stub.RegisterNode(register_request(f"node-{i}", slots=1, ttl=60))).node.revision
    if i % 3 == 1:
        return (await claim(store, f"job-{i}", ("node-w", i % 8))).revision
    return (await PlannerState(store).change(f"job-{i - 1}", release=[("node-w", (i - 1) % 8)])).revision


async def test_a_watcher_that_reconnects_after_a_broken_stream_misses_no_event(etcd, etcd_store):
    first = await start_registry(etcd.endpoint)
    channel = open_channel(first.address)
    stub = registry_pb2_grpc.RegistryServiceStub(channel)
    start = (await stub.RegisterNode(register_request("node-w", slots=8, ttl=60))).node.revision
    watch = Collector(stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=start)))
    written = [await _write(stub, etcd_store, i) for i in range(9)]
    await watch.wait_for(lambda e: e.revision == written[-1])

    await first.stop(0)  # the stream breaks with the server
    await watch.task
    assert watch.error is not None
    seen_before = [r.revision for r in watch.responses]
    await channel.close()

    second = await start_registry(etcd.endpoint)
    channel = open_channel(second.address)
    stub = registry_pb2_grpc.RegistryServiceStub(channel)
    written += [await _write(stub, etcd_store, i) for i in range(9, 18)]  # while nobody watches
    resumed = Collector(stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=seen_before[-1])))
    written += [await _write(stub, etcd_store, i) for i in range(18, 24)]
    await resumed.wait_for(lambda e: e.revision == written[-1])

    revisions = seen_before + [r.revision for r in resumed.responses]
    assert revisions == sorted(set(revisions)), "a revision came twice or out of order"
    assert revisions == written, "continuity: every write's revision exactly once, nothing else"
    assert all(e.kind != Kind.CLUSTER_EVENT_KIND_RESYNC for e in resumed.events)
    await resumed.close()
    await channel.close()
    await second.stop(0)


async def test_a_transaction_over_several_keys_arrives_as_one_response(registry_stub, etcd_store):
    node = await registry_stub.RegisterNode(register_request("node-t", slots=4))
    watch = Collector(registry_stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=node.node.revision)))
    claimed = await claim(etcd_store, "j", *(("node-t", i) for i in range(4)))
    await watch.wait_for(lambda e: e.revision == claimed.revision)
    [response] = watch.responses
    assert response.revision == claimed.revision
    assert sorted(e.claim.gpu.index for e in response.events) == [0, 1, 2, 3]
    assert {e.kind for e in response.events} == {Kind.CLUSTER_EVENT_KIND_GPU_CLAIMED}
    await watch.close()


async def test_a_watch_from_a_compacted_revision_resyncs_with_the_full_state_then_continues(registry_stub, etcd_store):
    old = (await registry_stub.RegisterNode(register_request("node-c", slots=2))).node.revision
    await claim(etcd_store, "old", ("node-c", 0))
    compact_at = await etcd_store.revision()
    await etcd_store._client.compact(compact_at)  # noqa: SLF001 (test set-up: make history unavailable)

    watch = Collector(registry_stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=old - 1)))
    resync = await watch.wait_for(lambda e: e.kind == Kind.CLUSTER_EVENT_KIND_RESYNC)
    assert resync.revision >= compact_at
    first = watch.responses[0]
    kinds = sorted(Kind.Name(e.kind) for e in first.events)
    assert kinds == sorted(["CLUSTER_EVENT_KIND_RESYNC", "CLUSTER_EVENT_KIND_NODE_ADDED", "CLUSTER_EVENT_KIND_GPU_CLAIMED"])
    later = (await claim(etcd_store, "new", ("node-c", 1))).revision
    event = await watch.wait_for(lambda e: e.revision == later)
    assert event.claim.job_id == "new"
    await watch.close()


async def test_watch_from_zero_starts_now(registry_stub, etcd_store):
    await registry_stub.RegisterNode(register_request("node-z", slots=2, ttl=60))
    await claim(etcd_store, "before", ("node-z", 0))
    watch = Collector(registry_stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=0)))
    await asyncio.sleep(0.3)  # let the watch start
    after = (await claim(etcd_store, "after", ("node-z", 1))).revision
    await watch.wait_for(lambda e: e.revision == after)
    assert [e.claim.job_id for e in watch.events] == ["after"]
    await watch.close()


async def test_a_watch_is_connected_before_anything_changes(registry_stub):
    """wait_for_connection() returns once the server holds the watch, with no change to report
    (gRPC sends the response headers with the first message unless the server sends them)."""
    call = registry_stub.WatchCluster(registry_pb2.WatchClusterRequest())
    await asyncio.wait_for(call.wait_for_connection(), 5)
    node = await registry_stub.RegisterNode(register_request("node-c", slots=1))
    reply = await asyncio.wait_for(call.read(), 5)
    assert [e.node.node_id for e in reply.events] == ["node-c"] and reply.revision == node.node.revision
    call.cancel()

