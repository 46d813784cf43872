"""Registry under load: simulated nodes registering and heartbeating (printed figures, not a test).

    .venv/bin/python bench/registry_load.py [--nodes 200] [--seconds 60] [--ttl 5] [--claims-per-s 2]

Starts its own etcd and a registry server process on loopback, then runs
--nodes simulated nodes in this process, each through the code a real
executor runs (`NodeMembership` on its own `open_channel` connection):
RegisterNode, then KeepAliveNode every ttl/3 seconds. Meanwhile one observer
lists the nodes every second, watches the cluster, and claims and releases
one GPU of a random node --claims-per-s times a second as the planner does
(its etcd transaction, `PlannerState.change`: the registry relays the
changes to the watch). At the end every node
deregisters. It prints p50/p95/p99/max latency and calls per second per RPC
kind, and the missed leases: nodes whose keepalive failed, that had to
register again, that were missing from a ListNodes, or that were removed
while alive. Exits 1 when a lease was missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omru.v1 import common_pb2, registry_pb2, registry_pb2_grpc  # noqa: E402
from services.common import logging as omru_logging  # noqa: E402
from services.common.channels import open_channel  # noqa: E402
from services.common.cluster import EtcdProcess, ServiceProcess, child_env, service_argv, wait_ready  # noqa: E402
from services.common.etcd import EtcdStore, EtcdUnavailable, LeaseNotFound  # noqa: E402
from services.planner.state import PlannerState  # noqa: E402
from services.registry.membership import NodeMembership  # noqa: E402

#: Calls in the order of the table (RPC method name, or the planner's etcd write -> row label).
KINDS = {
    "RegisterNode": "register", "KeepAliveNode": "keepalive", "ListNodes": "list",
    "claim": "claim", "release": "release", "DeregisterNode": "deregister",
}
#: Each simulated node its own TCP connection, as separate executor hosts have.
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)
REMOVED = registry_pb2.CLUSTER_EVENT_KIND_NODE_REMOVED


class CallRecorder(grpc.aio.UnaryUnaryClientInterceptor):
    """Latency of every unary call by method name, and the node_ids of failed calls."""

    def __init__(self) -> None:
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, Counter] = defaultdict(Counter)
        self.failed_nodes: dict[str, set[str]] = defaultdict(set)
        self.registrations: Counter = Counter()

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        method = client_call_details.method
        name = (method.decode() if isinstance(method, bytes) else method).rsplit("/", 1)[-1]
        began = time.perf_counter()
        call = await continuation(client_call_details, request)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            self.errors[name][exc.code().name] += 1
            self.failed_nodes[name].add(getattr(request, "node_id", ""))
        finally:
            self.latencies[name].append(time.perf_counter() - began)
        if name == "RegisterNode":
            self.registrations[request.node_id] += 1
        return call


@dataclass
class LoadResult:
    """What one load run saw."""

    nodes: int
    seconds: float
    recorder: CallRecorder
    missing_from_list: set[str] = field(default_factory=set)
    removed_while_alive: set[str] = field(default_factory=set)
    listed_at_end: set[str] = field(default_factory=set)
    register_s: float = 0.0  # all nodes registering at once, until the last is in
    leave_s: float = 0.0  # all nodes deregistering at once, until the last is out

    @property
    def keepalive_failed(self) -> set[str]:
        return self.recorder.failed_nodes["KeepAliveNode"]

    @property
    def registered_again(self) -> set[str]:
        return {n for n, count in self.recorder.registrations.items() if count > 1}

    @property
    def missed(self) -> set[str]:
        """Nodes that lost their lease, or looked lost to the cluster, at least once."""
        return self.keepalive_failed | self.registered_again | self.missing_from_list | self.removed_while_alive


def node_ids(nodes: int) -> list[str]:
    return [f"load-{i:04d}" for i in range(nodes)]


async def run_load(registry: str, etcd: str, nodes: int, seconds: float, ttl: int = 5, claims_per_s: float = 2.0,
                   seed: int = 1) -> LoadResult:
    """Run `nodes` simulated nodes against the registry at address (on the etcd at endpoint etcd) for `seconds`;
    every node leaves at the end."""
    recorder = CallRecorder()
    rng = random.Random(seed)
    ids = node_ids(nodes)
    slots = [common_pb2.GpuInfo(index=i, kind="cpu") for i in range(2)]
    channels = [open_channel(registry, interceptors=[recorder], options=OWN_CONNECTION) for _ in ids]
    members = [NodeMembership(ch, node_id, f"127.0.0.1:{20000 + i}", slots, ttl) for i, (ch, node_id) in enumerate(zip(channels, ids))]
    observer = open_channel(registry, interceptors=[recorder])
    stub = registry_pb2_grpc.RegistryServiceStub(observer)
    store = EtcdStore(etcd)
    await store.connect()
    state = PlannerState(store)
    result = LoadResult(nodes, seconds, recorder)
    alive: set[str] = set()

    async def watch() -> None:
        async for response in stub.WatchCluster(registry_pb2.WatchClusterRequest()):
            for event in response.events:
                if event.kind == REMOVED and event.node.node_id in alive:
                    result.removed_while_alive.add(event.node.node_id)

    async def start(member: NodeMembership) -> None:
        await member.start()
        alive.add(member.node_id)

    async def planner_write(kind: str, **change) -> None:
        began = time.perf_counter()
        try:
            await state.change("load-job", **change)
        except (EtcdUnavailable, LeaseNotFound) as exc:
            recorder.errors[kind][type(exc).__name__] += 1
        finally:
            recorder.latencies[kind].append(time.perf_counter() - began)

    async def observe(until: float) -> None:
        loop = asyncio.get_running_loop()
        next_claim = loop.time()
        while loop.time() < until:
            with contextlib.suppress(grpc.aio.AioRpcError):  # counted by the recorder
                listed = {n.node_id for n in (await stub.ListNodes(registry_pb2.ListNodesRequest())).nodes}
                result.missing_from_list |= alive - listed
            tick = loop.time() + 1.0
            while claims_per_s > 0 and next_claim < min(tick, until):
                await asyncio.sleep(max(0.0, next_claim - loop.time()))
                member = rng.choice(members)
                gpu = (member.node_id, rng.randrange(len(slots)))
                await planner_write("claim", claim={gpu: member.lease_id})
                await planner_write("release", release=[gpu])
                next_claim += 1.0 / claims_per_s
            await asyncio.sleep(max(0.0, min(tick, until) - loop.time()))

    watcher = asyncio.ensure_future(watch())
    try:
        began = time.perf_counter()
        await asyncio.gather(*(start(m) for m in members))
        result.register_s = time.perf_counter() - began
        await observe(asyncio.get_running_loop().time() + seconds)
        final = await stub.ListNodes(registry_pb2.ListNodesRequest())
        result.listed_at_end = {n.node_id for n in final.nodes} & set(ids)
        result.missing_from_list |= alive - result.listed_at_end
        result.seconds = time.perf_counter() - began
    finally:
        alive.clear()  # from here on, a removal is a leave
        watcher.cancel()
        leaving = time.perf_counter()
        await asyncio.gather(watcher, *(m.stop() for m in members), return_exceptions=True)
        result.leave_s = time.perf_counter() - leaving
        await asyncio.gather(observer.close(), store.close(), *(ch.close() for ch in channels))
    return result


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    return sorted_values[min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))]


def table(result: LoadResult) -> str:
    """The latency table and the lease verdict, as printed.

    calls/s: over the whole run; for register and deregister, over their
    burst (every node at once at the start, and at the end)."""
    spans = {"RegisterNode": result.register_s, "DeregisterNode": result.leave_s}
    rows = [f"{'rpc':<11} {'calls':>7} {'calls/s':>8} {'errors':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8}"]
    in_run = 0
    for method, label in KINDS.items():
        values = sorted(result.recorder.latencies.get(method, []))
        if not values:
            continue
        in_run += len(values) if method != "DeregisterNode" else 0
        errors = sum(result.recorder.errors[method].values())
        rate = len(values) / (spans.get(method) or result.seconds)
        ms = " ".join(f"{1000 * percentile(values, q):>8.1f}" for q in (0.50, 0.95, 0.99, 1.0))
        rows.append(f"{label:<11} {len(values):>7} {rate:>8.1f} {errors:>6} {ms}")
    rows.append(f"{'all in run':<11} {in_run:>7} {in_run / result.seconds:>8.1f}")
    rows.append(f"register burst {result.register_s:.2f} s, deregister burst {result.leave_s:.2f} s (all nodes at once)")
    errors = {m: dict(c) for m, c in result.recorder.errors.items() if c}
    rows.append(
        f"missed leases: {len(result.missed)} (keepalive failed {len(result.keepalive_failed)}, "
        f"registered again {len(result.registered_again)}, missing from ListNodes {len(result.missing_from_list)}, "
        f"removed while alive {len(result.removed_while_alive)})" + (f"; errors {errors}" if errors else "")
    )
    rows.append(f"listed at the end: {len(result.listed_at_end)}/{result.nodes} nodes")
    return "\n".join(rows)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200, help="simulated nodes (default 200)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long they heartbeat (default 60)")
    parser.add_argument("--ttl", type=int, default=5, help="lease TTL of each node in seconds, as executors' --ttl (default 5)")
    parser.add_argument("--claims-per-s", type=float, default=2.0, help="GPU claim + release pairs per second (default 2)")
    args = parser.parse_args()
    for name in ("nodes", "seconds", "ttl"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be above 0")
    if args.ttl > 3600:
        parser.error(f"--ttl {args.ttl} is above the registry's 3600 s")
    if args.claims_per_s < 0:
        parser.error(f"--claims-per-s {args.claims_per_s} is negative")
    omru_logging.configure("registry-load", level="WARNING")

    with tempfile.TemporaryDirectory(prefix="omru-registry-load-") as tmp:
        etcd = EtcdProcess(Path(tmp) / "etcd", log_file=Path(tmp) / "etcd.log").start()
        registry = ServiceProcess("registry", service_argv("registry", "--port", "0", "--etcd", etcd.endpoint), child_env(), Path(tmp) / "registry.log")
        try:
            wait_ready([registry.spawn()], 30.0)
            cpu_before = {"registry": cpu_seconds(registry.proc.pid), "etcd": cpu_seconds(etcd.proc.pid), "nodes": time.process_time()}
            result = asyncio.run(run_load(registry.address, etcd.endpoint, args.nodes, args.seconds, args.ttl,
                                          args.claims_per_s))
            cpu = {
                "registry": cpu_seconds(registry.proc.pid) - cpu_before["registry"],
                "etcd": cpu_seconds(etcd.proc.pid) - cpu_before["etcd"],
                "nodes": time.process_time() - cpu_before["nodes"],
            }
        finally:
            registry.stop()
            etcd.stop()
    print(
        f"registry load: {args.nodes} nodes, ttl {args.ttl} s (keepalive every {max(0.2, args.ttl / 3):.2f} s), "
        f"{result.seconds:.1f} s, {args.claims_per_s:g} claim+release/s, {os.cpu_count()} CPUs, loopback"
    )
    print(table(result))
    print("CPU use (share of one core): " + ", ".join(f"{k} {100 * v / result.seconds:.0f} %" for k, v in cpu.items()))
    return 1 if result.missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
