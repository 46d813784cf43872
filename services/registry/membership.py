"""A node's membership in the registry: register, heartbeat, re-register, leave.

`NodeMembership` registers the node with its GPUs under a lease, sends
KeepAliveNode every ttl/3 seconds, registers again when the registry says
NOT_FOUND (the lease expired, e.g. after a long etcd outage), and revokes the
lease on `stop()` (clean shutdown). A killed node simply stops heartbeating
and vanishes after its TTL. `on_renewed(deadline)` hears until when the lease
surely holds (the send time of the last successful request + TTL);
`on_lost(why)` is awaited when the lease is found gone, before registering
again (the node's allocations went with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Awaitable, Callable, Sequence

import grpc

from omru.v1 import common_pb2, registry_pb2, registry_pb2_grpc
from services.common.logging import get_logger

log = get_logger(__name__)


class NodeMembership:
    """Keeps one node registered while running."""

    def __init__(self, channel: grpc.aio.Channel, node_id: str, address: str, gpus: Sequence[common_pb2.GpuInfo], ttl_seconds: int,
                 on_renewed: Callable[[float], None] = lambda deadline: None,
                 on_lost: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.stub = registry_pb2_grpc.RegistryServiceStub(channel)
        self.node_id = node_id
        self.address = address
        self.gpus = list(gpus)
        self.ttl = ttl_seconds
        self.lease_id = 0
        self.on_renewed, self.on_lost = on_renewed, on_lost
        self._task: asyncio.Task | None = None

    async def register(self) -> registry_pb2.Node:
        request = registry_pb2.RegisterNodeRequest(node_id=self.node_id, address=self.address, gpus=self.gpus, ttl_seconds=self.ttl)
        sent = time.time()
        response = await self.stub.RegisterNode(request, timeout=max(2.0, self.ttl / 2))
        self.lease_id = response.lease_id
        self.on_renewed(sent + self.ttl)
        log.info("node_registered", node_id=self.node_id, lease_id=self.lease_id, gpus=len(self.gpus))
        return response.node

    async def start(self, retry_for: float = 10.0) -> registry_pb2.Node:
        """Register (retrying while the registry is not up yet), then heartbeat in the background."""
        deadline = asyncio.get_running_loop().time() + retry_for
        while True:
            try:
                node = await self.register()
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.1)
        self._task = asyncio.create_task(self._heartbeat())
        return node

    async def _heartbeat(self) -> None:
        interval = max(0.2, self.ttl / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                sent = time.time()
                await self.stub.KeepAliveNode(
                    registry_pb2.KeepAliveNodeRequest(node_id=self.node_id, lease_id=self.lease_id), timeout=interval
                )
                self.on_renewed(sent + self.ttl)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    log.warning("node_lease_lost", node_id=self.node_id, error=exc.details())
                    if self.on_lost is not None:
                        await self.on_lost(f"node lease lost: {exc.details()}")
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await self.register()
                else:
                    log.warning("heartbeat_failed", node_id=self.node_id, code=exc.code().name, error=exc.details())

    async def stop(self) -> None:
        """Stop heartbeating and revoke the lease."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.stub.DeregisterNode(registry_pb2.DeregisterNodeRequest(node_id=self.node_id), timeout=2.0)
        except grpc.aio.AioRpcError as exc:  # the lease then lapses after its TTL
            log.warning("node_deregister_failed", node_id=self.node_id, code=exc.code().name, error=exc.details())
        else:
            log.info("node_deregistered", node_id=self.node_id)
