"""Smoke test of bench/registry_load.py: a few simulated nodes keep their leases through a real registry."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from omru.v1 import registry_pb2

BENCH = Path(__file__).resolve().parents[2] / "bench" / "registry_load.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("registry_load", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def test_ten_heartbeating_nodes_miss_no_lease_are_all_listed_and_leave_at_the_end(etcd, registry, registry_stub):
    bench = load_bench()
    nodes = 10
    result = await bench.run_load(registry.address, etcd.endpoint, nodes=nodes, seconds=3, ttl=3, claims_per_s=2)

    assert result.missed == set(), bench.table(result)
    assert result.listed_at_end == set(bench.node_ids(nodes))
    calls = result.recorder.latencies
    assert len(calls["RegisterNode"]) == nodes and len(calls["DeregisterNode"]) == nodes
    assert len(calls["KeepAliveNode"]) >= nodes  # every second, 3 s long
    assert calls["claim"] and len(calls["claim"]) == len(calls["release"])  # the planner's writes
    assert not any(result.recorder.errors.values()), result.recorder.errors
    assert "missed leases: 0" in bench.table(result)
    left = await registry_stub.ListNodes(registry_pb2.ListNodesRequest())
    claims = await registry_stub.ListClaims(registry_pb2.ListClaimsRequest())
    assert list(left.nodes) == [] and list(claims.claims) == []


def test_bench_refuses_a_node_count_below_one_with_exit_2():
    done = subprocess.run([sys.executable, str(BENCH), "--nodes", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--nodes 0" in done.stderr
