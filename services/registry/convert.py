"""Conversions of the registry: etcd keys and values <-> omru.v1 messages,
etcd watch batches -> WatchClusterResponse.

Layout under the OMRU prefix (values are the serialized messages):
  cluster/nodes/<node_id>               Node      bound to the node's lease
  cluster/claims/<node_id>/<index:05d>  GpuClaim  bound to the node's lease
  allocs/<node_id>/<job_id>             Directive the job's attempt the node must run (the planner's
                                                  desired state), bound to the node's lease

WatchCluster watches `cluster/` alone: the planner's own writes (job records,
events) and the allocations never reach it.
"""

from __future__ import annotations

from omru.v1 import common_pb2, executor_pb2, registry_pb2
from services.common.etcd import Kv, Resync, WatchBatch, WatchEvent

CLUSTER = "cluster/"
NODES = CLUSTER + "nodes/"
CLAIMS = CLUSTER + "claims/"
ALLOCS = "allocs/"
Kind = registry_pb2.ClusterEventKind


def node_key(node_id: str) -> str:
    return f"{NODES}{node_id}"


def claim_key(node_id: str, index: int) -> str:
    return f"{CLAIMS}{node_id}/{index:05d}"


def alloc_prefix(node_id: str) -> str:
    return f"{ALLOCS}{node_id}/"


def alloc_key(node_id: str, job_id: str) -> str:
    return f"{ALLOCS}{node_id}/{job_id}"


def gpu_from_claim_key(key: str) -> common_pb2.GpuRef:
    node_id, _, index = key[len(CLAIMS) :].rpartition("/")
    return common_pb2.GpuRef(node_id=node_id, index=int(index))


def encode(message) -> bytes:
    return message.SerializeToString(deterministic=True)


def node_from_kv(kv: Kv) -> registry_pb2.Node:
    node = registry_pb2.Node.FromString(kv.value)
    node.revision = kv.mod_revision
    return node


def claim_from_kv(kv: Kv) -> registry_pb2.GpuClaim:
    claim = registry_pb2.GpuClaim.FromString(kv.value)
    claim.revision = kv.mod_revision
    return claim


def cluster_event(event: WatchEvent) -> registry_pb2.ClusterEvent | None:
    """The ClusterEvent of one etcd change (None for keys the registry does not own)."""
    rev = event.revision
    put = event.kind == "put"
    data = event.value if put else event.prev_value
    if event.key.startswith(NODES):
        node = registry_pb2.Node.FromString(data) if data else registry_pb2.Node(node_id=event.key[len(NODES) :])
        if put:
            node.revision = rev
            kind = Kind.CLUSTER_EVENT_KIND_NODE_ADDED if event.prev_value is None else Kind.CLUSTER_EVENT_KIND_NODE_UPDATED
        else:
            kind = Kind.CLUSTER_EVENT_KIND_NODE_REMOVED
        return registry_pb2.ClusterEvent(revision=rev, kind=kind, node=node)
    if event.key.startswith(CLAIMS):
        claim = registry_pb2.GpuClaim.FromString(data) if data else registry_pb2.GpuClaim(gpu=gpu_from_claim_key(event.key))
        if put:
            claim.revision = rev
        kind = Kind.CLUSTER_EVENT_KIND_GPU_CLAIMED if put else Kind.CLUSTER_EVENT_KIND_GPU_RELEASED
        return registry_pb2.ClusterEvent(revision=rev, kind=kind, claim=claim)
    return None


def state_event(kv: Kv) -> registry_pb2.ClusterEvent | None:
    """The ClusterEvent that recreates one stored record (after a resync)."""
    return cluster_event(WatchEvent("put", kv.key, kv.value, None, kv.mod_revision))


def watch_response(item: WatchBatch | Resync) -> registry_pb2.WatchClusterResponse | None:
    """The response for one watch batch or resync (None when nothing of the registry changed)."""
    if isinstance(item, Resync):
        events = [registry_pb2.ClusterEvent(revision=item.revision, kind=Kind.CLUSTER_EVENT_KIND_RESYNC)]
        events += [e for e in map(state_event, item.kvs) if e is not None]
        return registry_pb2.WatchClusterResponse(revision=item.revision, events=events)
    events = [e for e in map(cluster_event, item.events) if e is not None]
    if not events:
        return None
    return registry_pb2.WatchClusterResponse(revision=item.revision, events=events)


def allocations_response(item: WatchBatch | Resync) -> registry_pb2.WatchAllocationsResponse:
    """The WatchAllocations response for one watch batch or resync of a node's allocations."""
    if isinstance(item, Resync):
        return registry_pb2.WatchAllocationsResponse(
            revision=item.revision, snapshot=True, allocations=[executor_pb2.Directive.FromString(kv.value) for kv in item.kvs])
    response = registry_pb2.WatchAllocationsResponse(revision=item.revision)
    for e in item.events:
        if e.kind == "put":
            response.allocations.append(executor_pb2.Directive.FromString(e.value))
        else:
            response.removed_job_ids.append(e.key.rpartition("/")[2])
    return response
