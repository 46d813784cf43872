"""Exclusive GPU claims: create-if-absent etcd transactions, all or nothing."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from conftest import start_registry

from omru.v1 import registry_pb2, registry_pb2_grpc
from platform_helpers import gpu, register_request, rpc_error
from services.common.channels import open_channel


@pytest.mark.parametrize("contenders", [2, 6])
async def test_concurrent_claims_of_one_gpu_through_two_registries_exactly_one_wins(etcd, registry, registry_stub, contenders):
    other = await start_registry(etcd.endpoint)
    channel = open_channel(other.address)
    stubs = [registry_stub, registry_pb2_grpc.RegistryServiceStub(channel)]
    await registry_stub.RegisterNode(register_request("node-a", slots=2))
    calls = [
        stubs[i % 2].ClaimGpus(registry_pb2.ClaimGpusRequest(job_id=f"job-{i}", gpus=[gpu("node-a", 1)]))
        for i in range(contenders)
    ]
    results = await asyncio.gather(*calls, return_exceptions=True)
    winners = [i for i, r in enumerate(results) if isinstance(r, registry_pb2.ClaimGpusResponse)]
    assert len(winners) == 1, results
    losers = [r for r in results if not isinstance(r, registry_pb2.ClaimGpusResponse)]
    assert all(r.code() == grpc.StatusCode.FAILED_PRECONDITION for r in losers)
    assert all(f"job-{winners[0]}" in r.details() and "node-a:1" in r.details() for r in losers)
    claims = (await registry_stub.ListClaims(registry_pb2.ListClaimsRequest())).claims
    assert [(c.job_id, c.gpu.node_id, c.gpu.index) for c in claims] == [(f"job-{winners[0]}", "node-a", 1)]
    await channel.close()
    await other.stop(0)


async def test_a_claim_that_meets_one_taken_gpu_claims_nothing(registry_stub):
    await registry_stub.RegisterNode(register_request("node-a", slots=4))
    await registry_stub.ClaimGpus(registry_pb2.ClaimGpusRequest(job_id="first", gpus=[gpu("node-a", 2)]))
    error = await rpc_error(
        registry_stub.ClaimGpus(registry_pb2.ClaimGpusRequest(job_id="second", gpus=[gpu("node-a", i) for i in range(4)]))
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'first'" in error.details()
    claims = (await registry_stub.ListClaims(registry_pb2.ListClaimsRequest())).claims
    assert [(c.job_id, c.gpu.index) for c in claims] == [("first", 2)]


async def test_claiming_gpus_the_job_already_holds_is_idempotent(registry_stub):
    await registry_stub.RegisterNode(register_request("node-a", slots=3))
    await registry_stub.ClaimGpus(registry_pb2.ClaimGpusRequest(job_id="j", gpus=[gpu("node-a", 0)]))
    again = await registry_stub.ClaimGpus(registry_pb2.ClaimGpusRequest(job_id="j", gpus=[gpu("node-a", 0), gpu("node-a", 1)]))
    assert [(c.job_id, c.gpu.index) for c in again.claims] == [("j", 0), ("j", 1)]
    assert len((await registry_stub.ListClaims(registry_pb2.ListClaimsRequest(job_id="j"))).claims) == 2


async def test_release_removes_only_the_owners_claims(registry_stub):
    await registry_stub.RegisterNode(register_request("node-a", slots=3))
    await registry_stub.ClaimGpus(registry_pb2.ClaimGpusRequest(job_id="a", gpus=[gpu("node-a", 0), gpu("node-a", 1)]))
    await registry_stub.ClaimGpus(registry_pb2.ClaimGpusRequest(job_id="b", gpus=[gpu("node-a", 2)]))
    foreign = await registry_stub.ReleaseGpus(registry_pb2.ReleaseGpusRequest(job_id="a", gpus=[gpu("node-a", 2)]))
    assert not foreign.released
    own = await registry_stub.ReleaseGpus(registry_pb2.ReleaseGpusRequest(job_id="a"))
    assert sorted(g.index for g in own.released) == [0, 1]
    claims = (await registry_stub.ListClaims(registry_pb2.ListClaimsRequest())).claims
    assert [(c.job_id, c.gpu.index) for c in claims] == [("b", 2)]


async def test_claims_vanish_with_their_node(registry_stub):
    await registry_stub.RegisterNode(register_request("node-a", slots=2))
    await registry_stub.ClaimGpus(registry_pb2.ClaimGpusRequest(job_id="a", gpus=[gpu("node-a", 0)]))
    await registry_stub.DeregisterNode(registry_pb2.DeregisterNodeRequest(node_id="node-a"))
    assert not (await registry_stub.ListClaims(registry_pb2.ListClaimsRequest())).claims


async def test_a_job_claims_the_gpus_of_a_big_cluster_in_one_call(registry_stub):
    # 256 GPUs: twice as many writes as etcd's default transaction allows (128)
    for n in range(8):
        await registry_stub.RegisterNode(register_request(f"node-{n}", slots=32, port=4000 + n))
    wanted = [gpu(f"node-{n}", i) for n in range(8) for i in range(32)]
    reply = await registry_stub.ClaimGpus(registry_pb2.ClaimGpusRequest(job_id="wide", gpus=wanted), timeout=10)
    assert len(reply.claims) == 256 and {c.job_id for c in reply.claims} == {"wide"}
