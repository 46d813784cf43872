"""Registry operations on etcd, in terms of omru.v1 messages.

Input is validated by the servicer first; what can only be known from the
stored state raises `RegistryError` with a kind the servicer maps to a gRPC
code ("not_found"). GPU claims are the planner's to write
(services/planner/state.py); the registry only lists them.
"""

from __future__ import annotations

import time
from typing import AsyncIterator, Sequence

from omru.v1 import common_pb2, registry_pb2
from services.common.etcd import EtcdStore, Resync
from services.registry import convert
from services.registry.convert import encode, node_key


class RegistryError(Exception):
    """A request that the stored state refuses; kind names the gRPC code."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class RegistryStore:
    """Nodes in etcd, and the GPU claims and allocations the planner writes there."""

    def __init__(self, etcd: EtcdStore, clock=time.time) -> None:
        self.etcd = etcd
        self._clock = clock
        self._leases: dict[str, int] = {}  # node -> the lease a keep-alive found to be its own

    # --- nodes -------------------------------------------------------------

    async def register_node(self, node_id: str, address: str, gpus: Sequence[common_pb2.GpuInfo], ttl: int) -> registry_pb2.Node:
        """Store the node under a fresh lease (an older registration is revoked first)."""
        old = await self.etcd.get(node_key(node_id))
        if old is not None:
            await self.etcd.revoke_lease(old.lease)
        lease_id = await self.etcd.grant_lease(ttl)
        node = registry_pb2.Node(
            node_id=node_id, address=address, gpus=sorted(gpus, key=lambda g: g.index),
            lease_id=lease_id, ttl_seconds=ttl, registered_unix_s=self._clock(),
        )
        node.revision = await self.etcd.put(node_key(node_id), encode(node), lease=lease_id)
        return node

    async def keep_alive(self, node_id: str, lease_id: int) -> int:
        """Refresh the node's lease; returns the TTL. not_found when the node or lease is gone."""
        if self._leases.get(node_id) != lease_id:
            # read once per lease: a node registering again revokes its old lease, so a lease that was
            # the node's and is still alive is still the node's
            node = await self.get_node(node_id)
            if node.lease_id != lease_id:
                raise RegistryError("not_found", f"lease_id {lease_id} is not the lease of node_id {node_id!r} (register again)")
            self._leases[node_id] = lease_id
        ttl = await self.etcd.refresh_lease(lease_id)
        if ttl <= 0:
            self._leases.pop(node_id, None)
            raise RegistryError("not_found", f"lease_id {lease_id} of node_id {node_id!r} expired (register again)")
        return ttl

    async def deregister_node(self, node_id: str) -> bool:
        """Revoke the node's lease (node and claims vanish); False when it was gone."""
        kv = await self.etcd.get(node_key(node_id))
        if kv is None:
            return False
        return await self.etcd.revoke_lease(kv.lease)

    async def get_node(self, node_id: str) -> registry_pb2.Node:
        kv = await self.etcd.get(node_key(node_id))
        if kv is None:
            raise RegistryError("not_found", f"node_id {node_id!r} not found")
        return convert.node_from_kv(kv)

    async def list_nodes(self) -> tuple[list[registry_pb2.Node], int]:
        kvs, revision = await self.etcd.list(convert.NODES)
        return [convert.node_from_kv(kv) for kv in kvs], revision

    # --- GPU claims ----------------------------------------------------------

    async def list_claims(self, job_id: str = "") -> tuple[list[registry_pb2.GpuClaim], int]:
        kvs, revision = await self.etcd.list(convert.CLAIMS)
        claims = [convert.claim_from_kv(kv) for kv in kvs]
        return [c for c in claims if not job_id or c.job_id == job_id], revision

    # --- watch ---------------------------------------------------------------

    async def watch_allocations(self, node_id: str) -> AsyncIterator[registry_pb2.WatchAllocationsResponse]:
        """The node's allocations now (a snapshot), then every change to them, forever."""
        prefix = convert.alloc_prefix(node_id)
        kvs, revision = await self.etcd.list(prefix)
        yield convert.allocations_response(Resync(revision, tuple(kvs)))
        async for item in self.etcd.watch(prefix, revision):
            yield convert.allocations_response(item)

    async def watch(self, after_revision: int) -> AsyncIterator[registry_pb2.WatchClusterResponse]:
        """Every registry change after after_revision (0 = from now), one response per revision."""
        async for item in self.etcd.watch(convert.CLUSTER, after_revision):
            response = convert.watch_response(item)
            if response is not None:
                yield response
