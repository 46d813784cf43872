"""Builders and small async helpers for the platform tests."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc

from omru.v1 import common_pb2, registry_pb2


def gpu(node_id: str, index: int) -> common_pb2.GpuRef:
    return common_pb2.GpuRef(node_id=node_id, index=index)


def cpu_slots(n: int) -> list[common_pb2.GpuInfo]:
    return [common_pb2.GpuInfo(index=i, kind="cpu") for i in range(n)]


def register_request(node_id: str = "node-a", slots: int = 2, ttl: int = 5, port: int = 4000) -> registry_pb2.RegisterNodeRequest:
    return registry_pb2.RegisterNodeRequest(node_id=node_id, address=f"127.0.0.1:{port}", gpus=cpu_slots(slots), ttl_seconds=ttl)


async def node_lease(store, node_id: str) -> int:
    """The registry lease of the node (the claims and allocations of its GPUs are bound to it)."""
    from services.registry import convert

    return convert.node_from_kv(await store.get(convert.node_key(node_id))).lease_id


async def claim(store, job_id: str, *gpus: tuple[str, int]):
    """Claim the GPUs for the job as the planner does (`PlannerState.change`: one etcd transaction, all or
    nothing, each claim bound to its node's lease); the transaction's result."""
    from services.planner.state import PlannerState

    leases = {node: await node_lease(store, node) for node in {n for n, _ in gpus}}
    return await PlannerState(store).change(job_id, claim={g: leases[g[0]] for g in gpus})


async def rpc_error(call) -> grpc.aio.AioRpcError:
    """The AioRpcError an awaited call raises (AssertionError when it succeeds)."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError("call succeeded, expected an error")


class Collector:
    """Reads a WatchCluster stream in the background into a list of events."""

    def __init__(self, call) -> None:
        self.call = call
        self.responses: list[registry_pb2.WatchClusterResponse] = []
        self.error: BaseException | None = None
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            async for response in self.call:
                self.responses.append(response)
        except BaseException as exc:  # the test inspects it
            self.error = exc

    @property
    def events(self) -> list[registry_pb2.ClusterEvent]:
        return [e for r in self.responses for e in r.events]

    async def wait_for(self, predicate, timeout: float = 10.0) -> registry_pb2.ClusterEvent:
        """The first event matching predicate, waiting up to timeout seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events:
                if predicate(event):
                    return event
            if self.task.done():
                raise AssertionError(f"watch ended ({self.error!r}) before the event came")
            await asyncio.sleep(0.02)
        raise AssertionError(f"no matching event within {timeout} s; got {[registry_pb2.ClusterEventKind.Name(e.kind) for e in self.events]}")

    async def close(self) -> None:
        self.call.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def cmdline(pid: int) -> str:
    """The process's command line ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """True while the process runs (a zombie, exited but not reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def descendants(pid: int) -> dict[int, str]:
    """Every live descendant of pid (zombies left out), with its command line (from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {p: c for p in found if (c := cmdline(p))}


def exported_families() -> dict[str, dict[str, str]]:
    """service -> {family name: type} of the omru_* families its collectors describe (what its /metrics
    serves, but the process_* families), read from the collectors themselves (no service runs)."""
    from services.common.metrics import EtcdErrors
    from services.executor.metrics import ExecutorCollector
    from services.planner.metrics import PlannerMeter
    from services.profiler.metrics import ProfilerMeter
    from services.registry.metrics import RegistryMeter

    collectors = {
        "planner": [PlannerMeter().bind(None, None), EtcdErrors(None)],
        "registry": [RegistryMeter().bind(None, None), EtcdErrors(None)],
        "profiler": [ProfilerMeter(), EtcdErrors(None)],
        "executor": [ExecutorCollector("node", None, None)],
    }
    return {service: {f.name: f.type for c in cs for f in c.describe()} for service, cs in collectors.items()}


def sample_names(name: str, kind: str) -> set[str]:
    """The names of the samples a family of that type exposes (what a PromQL query may name)."""
    return {"counter": {f"{name}_total", f"{name}_created"}, "gauge": {name},
            "histogram": {f"{name}_bucket", f"{name}_count", f"{name}_sum", f"{name}_created"},
            "summary": {name, f"{name}_count", f"{name}_sum", f"{name}_created"}}[kind]


def etcd_http_range(endpoint: str) -> tuple[int, str]:
    """The issue's probe: etcd's JSON gateway listing every key under /omru/ (status, body)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://{endpoint}/v3/kv/range", data=b'{"key":"L29tcnUv","range_end":"L29tcnUw"}')
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()

