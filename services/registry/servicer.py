"""RegistryService: thin gRPC layer over RegistryStore.

Validates the request (INVALID_ARGUMENT naming the field, before anything is
read or written), calls the store, maps RegistryError kinds and etcd
outages to status codes.
"""

from __future__ import annotations

import functools
import inspect

import grpc

from omru.v1 import registry_pb2, registry_pb2_grpc
from services.common.errors import abort, abort_invalid, grpc_errors
from services.registry import validation as v
from services.registry.metrics import RegistryMeter
from services.registry.store import RegistryError, RegistryStore

_CODES = {"not_found": grpc.StatusCode.NOT_FOUND}


def _registry_errors(method):
    """RegistryError -> its status code; etcd outage -> UNAVAILABLE."""
    if inspect.isasyncgenfunction(method):
        return grpc_errors(method)

    @functools.wraps(method)
    async def unary(self, request, context):
        try:
            return await method(self, request, context)
        except RegistryError as exc:
            await abort(context, _CODES[exc.kind], str(exc))

    return grpc_errors(unary)


async def _check(context, *problems: v.Problem) -> None:
    for problem in problems:
        if problem:
            await abort_invalid(context, *problem)


class RegistryServicer(registry_pb2_grpc.RegistryServiceServicer):
    """omru.v1.RegistryService on etcd."""

    def __init__(self, store: RegistryStore, max_ttl_seconds: int = 3600) -> None:
        self.store = store
        self.max_ttl = max_ttl_seconds
        self.meter = RegistryMeter()  # renewals, registrations, claims as they happen (metrics.py)

    @_registry_errors
    async def RegisterNode(self, request, context):
        ttl_problem = None
        if not 1 <= request.ttl_seconds <= self.max_ttl:
            ttl_problem = ("ttl_seconds", f"{request.ttl_seconds} is not in 1..{self.max_ttl}")
        await _check(
            context,
            v.id_problem("node_id", request.node_id),
            v.address_problem("address", request.address),
            v.gpu_infos_problem("gpus", request.gpus),
            ttl_problem,
        )
        with self.meter.registration():
            node = await self.store.register_node(request.node_id, request.address, list(request.gpus), request.ttl_seconds)
        return registry_pb2.RegisterNodeResponse(lease_id=node.lease_id, node=node)

    @_registry_errors
    async def KeepAliveNode(self, request, context):
        await _check(
            context,
            v.id_problem("node_id", request.node_id),
            ("lease_id", "is required") if request.lease_id <= 0 else None,
        )
        with self.meter.renewal():
            ttl = await self.store.keep_alive(request.node_id, request.lease_id)
        return registry_pb2.KeepAliveNodeResponse(ttl_seconds=ttl)

    @_registry_errors
    async def DeregisterNode(self, request, context):
        await _check(context, v.id_problem("node_id", request.node_id))
        return registry_pb2.DeregisterNodeResponse(removed=await self.store.deregister_node(request.node_id))

    @_registry_errors
    async def GetNode(self, request, context):
        await _check(context, v.id_problem("node_id", request.node_id))
        return registry_pb2.GetNodeResponse(node=await self.store.get_node(request.node_id))

    @_registry_errors
    async def ListNodes(self, request, context):
        nodes, revision = await self.store.list_nodes()
        return registry_pb2.ListNodesResponse(nodes=nodes, revision=revision)

    @_registry_errors
    async def ListClaims(self, request, context):
        if request.job_id:
            await _check(context, v.id_problem("job_id", request.job_id))
        claims, revision = await self.store.list_claims(request.job_id)
        return registry_pb2.ListClaimsResponse(claims=claims, revision=revision)

    @_registry_errors
    async def WatchCluster(self, request, context):
        await _check(context, ("after_revision", f"{request.after_revision} is negative") if request.after_revision < 0 else None)
        # Headers now, not with the first change: a client's wait_for_connection() returns once
        # the watch is set up, even while nothing changes.
        await context.send_initial_metadata(())
        async for response in self.store.watch(request.after_revision):
            yield response

    @_registry_errors
    async def WatchAllocations(self, request, context):
        await _check(context, v.id_problem("node_id", request.node_id))
        async for response in self.store.watch_allocations(request.node_id):
            yield response
