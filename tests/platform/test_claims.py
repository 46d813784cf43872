"""Exclusive GPU claims as the planner writes them (`PlannerState.change`):
create-if-absent etcd transactions, all or nothing, bound to the node's lease;
the registry lists them (ListClaims)."""

from __future__ import annotations

import asyncio

import pytest

from omru.v1 import registry_pb2
from platform_helpers import claim, register_request
from services.common.etcd import EtcdStore
from services.registry import convert


async def _claims(registry_stub) -> list[tuple[str, str, int]]:
    claims = (await registry_stub.ListClaims(registry_pb2.ListClaimsRequest())).claims
    return [(c.job_id, c.gpu.node_id, c.gpu.index) for c in claims]


@pytest.mark.parametrize("contenders", [2, 6])
async def test_concurrent_claims_of_one_gpu_through_two_etcd_clients_exactly_one_wins(etcd, etcd_store, registry_stub,
                                                                                     contenders):
    await registry_stub.RegisterNode(register_request("node-a", slots=2))
    async with EtcdStore(etcd.endpoint) as other:
        stores = [etcd_store, other]
        results = await asyncio.gather(*(claim(stores[i % 2], f"job-{i}", ("node-a", 1)) for i in range(contenders)))
    winners = [i for i, r in enumerate(results) if r.succeeded]
    assert len(winners) == 1, results
    # each loser learns who holds the GPU, and wrote nothing
    assert all([convert.claim_from_kv(kv).job_id for kv in r.existing] == [f"job-{winners[0]}"]
               for r in results if not r.succeeded)
    assert await _claims(registry_stub) == [(f"job-{winners[0]}", "node-a", 1)]


async def test_a_claim_that_meets_one_taken_gpu_claims_nothing(etcd_store, registry_stub):
    await registry_stub.RegisterNode(register_request("node-a", slots=4))
    assert (await claim(etcd_store, "first", ("node-a", 2))).succeeded
    refused = await claim(etcd_store, "second", *(("node-a", i) for i in range(4)))
    assert not refused.succeeded
    assert [convert.claim_from_kv(kv).job_id for kv in refused.existing] == ["first"]
    assert await _claims(registry_stub) == [("first", "node-a", 2)]


async def test_claims_vanish_with_their_node(etcd_store, registry_stub):
    await registry_stub.RegisterNode(register_request("node-a", slots=2))
    assert (await claim(etcd_store, "a", ("node-a", 0))).succeeded
    await registry_stub.DeregisterNode(registry_pb2.DeregisterNodeRequest(node_id="node-a"))
    assert await _claims(registry_stub) == []


async def test_a_job_claims_the_gpus_of_a_big_cluster_in_one_transaction(etcd_store, registry_stub):
    # 256 GPUs: twice as many writes as etcd's default transaction allows (128)
    for n in range(8):
        await registry_stub.RegisterNode(register_request(f"node-{n}", slots=32, port=4000 + n))
    assert (await claim(etcd_store, "wide", *((f"node-{n}", i) for n in range(8) for i in range(32)))).succeeded
    claims = await _claims(registry_stub)
    assert len(claims) == 256 and {job for job, _, _ in claims} == {"wide"}
