"""No silent input loss: every field is honoured exactly or refused naming the
field and the bad value (INVALID_ARGUMENT; the CLI: exit code 2), with the
echoed value cut short; nothing of a refused request is stored."""

from __future__ import annotations

import grpc

from omru.spec import MAX_GPUS_PER_NODE, shown
from omru.v1 import common_pb2, registry_pb2
from platform_helpers import register_request, rpc_error
from services.common.errors import MAX_MESSAGE, bounded

INVALID = grpc.StatusCode.INVALID_ARGUMENT
MB = "a" * (1 << 20)
#: A 1 MB value echoed: its first 64 characters, then its length.
MB_SHOWN = f"'{'a' * 64}'...(1048576 chars)"


def test_shown_cuts_long_values_and_counts_them():
    assert shown("abc") == "'abc'"
    assert shown(MB) == MB_SHOWN
    assert shown(list(range(100))).endswith("...(390 chars)") and len(shown(list(range(100)))) < 90
    message = "x: " + "é" * 5000
    assert len(bounded(message).encode()) <= MAX_MESSAGE and bounded(message).endswith("...(5003 chars)")
    assert bounded("short") == "short"


def _nodes(nodes: registry_pb2.ListNodesResponse) -> list:
    return [(n.node_id, len(n.gpus)) for n in nodes.nodes]


async def test_registry_bounds_gpus_per_node_kinds_and_ids_and_stores_nothing_refused(registry_stub, etcd_store):
    await registry_stub.RegisterNode(register_request("node-a", slots=2, ttl=60))
    before = await etcd_store.revision()

    many = register_request("node-b", slots=100_000, ttl=60)
    error = await rpc_error(registry_stub.RegisterNode(many))
    assert (error.code(), error.details()) == (INVALID, "gpus: 100000 GPUs, at most 256 per node")

    long_kind = register_request("node-c", ttl=60)
    long_kind.gpus[0].kind = MB
    error = await rpc_error(registry_stub.RegisterNode(long_kind))
    assert (error.code(), error.details()) == (INVALID, f"gpus[0].kind: {MB_SHOWN} is longer than 255 characters")

    high_index = register_request("node-d", ttl=60)
    high_index.gpus[1].index = MAX_GPUS_PER_NODE
    error = await rpc_error(registry_stub.RegisterNode(high_index))
    assert (error.code(), error.details()) == (INVALID, "gpus[1].index: 256 is not in 0..255")

    long_address = register_request("node-e", ttl=60)
    long_address.address = "h" * 300 + ":4000"
    error = await rpc_error(registry_stub.RegisterNode(long_address))
    assert error.code() == INVALID and error.details().startswith("address: 'hhhh") and "(305 chars)" in error.details()

    for call in (registry_stub.GetNode(registry_pb2.GetNodeRequest(node_id=MB)),
                 registry_stub.ClaimGpus(registry_pb2.ClaimGpusRequest(job_id=MB, gpus=[common_pb2.GpuRef(node_id="node-a")]))):
        error = await rpc_error(call)
        assert error.code() == INVALID, error.details()
        assert MB_SHOWN in error.details() and len(error.details()) < 300

    assert await etcd_store.revision() == before
    assert _nodes(await registry_stub.ListNodes(registry_pb2.ListNodesRequest())) == [("node-a", 2)]

    await registry_stub.RegisterNode(register_request("node-f", slots=MAX_GPUS_PER_NODE, ttl=60))  # the limit itself
    assert ("node-f", 256) in _nodes(await registry_stub.ListNodes(registry_pb2.ListNodesRequest()))
