"""Bad input: INVALID_ARGUMENT / NOT_FOUND naming the field; nothing stored changes."""

from __future__ import annotations

import grpc
import pytest

from omru.v1 import common_pb2, registry_pb2
from platform_helpers import claim, register_request, rpc_error

INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
R = registry_pb2


def _register(**changes):
    request = register_request("node-x")
    for name, value in changes.items():
        if name == "gpus":
            del request.gpus[:]
            request.gpus.extend(value)
        else:
            setattr(request, name, value)
    return request


CASES = [
    ("RegisterNode", _register(node_id=""), INVALID, "node_id"),
    ("RegisterNode", _register(node_id="bad id!"), INVALID, "node_id"),
    ("RegisterNode", _register(address="nowhere"), INVALID, "address"),
    ("RegisterNode", _register(gpus=[]), INVALID, "gpus"),
    ("RegisterNode", _register(gpus=[common_pb2.GpuInfo(index=-1, kind="cpu")]), INVALID, "gpus[0].index"),
    ("RegisterNode", _register(gpus=[common_pb2.GpuInfo(index=0, kind="cpu")] * 2), INVALID, "gpus[1].index"),
    ("RegisterNode", _register(ttl_seconds=0), INVALID, "ttl_seconds"),
    ("RegisterNode", _register(ttl_seconds=-5), INVALID, "ttl_seconds"),
    ("KeepAliveNode", R.KeepAliveNodeRequest(node_id="node-a"), INVALID, "lease_id"),
    ("KeepAliveNode", R.KeepAliveNodeRequest(node_id="ghost", lease_id=7), NOT_FOUND, "node_id"),
    ("GetNode", R.GetNodeRequest(), INVALID, "node_id"),
    ("GetNode", R.GetNodeRequest(node_id="ghost"), NOT_FOUND, "node_id"),
]


async def _snapshot(stub, etcd_store):
    nodes = await stub.ListNodes(R.ListNodesRequest())
    claims = await stub.ListClaims(R.ListClaimsRequest())
    return await etcd_store.revision(), list(nodes.nodes), list(claims.claims)


@pytest.mark.parametrize("method,request_,code,field", CASES, ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(CASES)])
async def test_bad_request_is_refused_naming_the_field_and_changes_nothing(registry_stub, etcd_store, method, request_, code, field):
    await registry_stub.RegisterNode(register_request("node-a", slots=2, ttl=60))
    assert (await claim(etcd_store, "job-1", ("node-a", 1))).succeeded
    before = await _snapshot(registry_stub, etcd_store)
    error = await rpc_error(getattr(registry_stub, method)(request_))
    assert error.code() == code, error.details()
    assert field in error.details()
    assert await _snapshot(registry_stub, etcd_store) == before


async def test_negative_watch_revision_is_invalid(registry_stub):
    error = await rpc_error(registry_stub.WatchCluster(R.WatchClusterRequest(after_revision=-1)).read())
    assert error.code() == INVALID
    assert "after_revision" in error.details()
