"""An OMRU cluster over network-namespace hosts (see netns.py).

    head     etcd (2379/2380), registry (50052), profiler (50053), planner (50051)
    host-a   one executor (50060), node id host-a
    host-b   one executor (50060), node id host-b

Every service listens on (and an executor advertises) its host's address
only. Executors get ``slots`` CPU slots, a lease of ``ttl`` seconds and a
work folder of their own (``work_dir/<node>``: the lease file and logs are
the node's). As deployed (deploy/README.md), one shared folder,
``work_dir/shared`` (``checkpoints``), is at the same path on every host (the
namespaces share the file system, as nodes mount shared storage) and is the
planner's ``--checkpoint-root``. The test process, on no host, reaches
the planner, the registry and etcd through `netns.Forward` loopback
addresses: ``planner``, ``registry``, ``etcd_endpoint``.

Services are `ServiceProcess`es run through ``ip netns exec``; they and etcd
get SIGTERM when the test process dies (parent-death signal), and `stop`
stops everything, then deletes the namespaces, even after a failed start.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from services.common.cluster import DIE_WITH_PARENT_ENV, EtcdProcess, ServiceProcess, child_env, service_argv, wait_ready
from tests.multihost.netns import Forward, Host, Network

PLANNER_PORT, REGISTRY_PORT, PROFILER_PORT, EXECUTOR_PORT = 50051, 50052, 50053, 50060
ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380
NODES = ("host-a", "host-b")


class MultiHostCluster:
    def __init__(self, work_dir: Path, ttl: int = 5, slots: int = 1, ready_timeout: float = 60.0) -> None:
        self.work_dir = Path(work_dir)
        self.ttl, self.slots, self.ready_timeout = ttl, slots, ready_timeout
        self.checkpoints = self.work_dir / "shared"
        self.net = Network(["head", *NODES])
        self.etcd: EtcdProcess | None = None
        self.services: dict[str, ServiceProcess] = {}
        self.forwards: list[Forward] = []
        # etcd's data in memory where there is /dev/shm: a busy disk's fsync stalls (seconds on a
        # loaded 2-core VM) would expire the leases of healthy nodes
        shm = Path("/dev/shm")
        self._etcd_dir = Path(tempfile.mkdtemp(prefix="omru-mh-etcd-", dir=shm if shm.is_dir() else self.work_dir))

    @property
    def head(self) -> Host:
        return self.net.hosts["head"]

    def host(self, node_id: str) -> Host:
        return self.net.hosts[node_id]

    def _forward(self, host: Host, port: int) -> str:
        f = Forward(host, f"{host.address}:{port}")
        self.forwards.append(f)
        return f.address

    def _spawn(self, name: str, host: Host, module: str, *args: str, env: dict[str, str] | None = None) -> ServiceProcess:
        extra = {DIE_WITH_PARENT_ENV: "1", **(env or {})}
        argv = [*host.prefix, *service_argv(module, "--host", host.address, *args)]
        s = ServiceProcess(name, argv, child_env(extra), self.work_dir / "logs" / f"{name}.log").spawn()
        self.services[name] = s
        return s

    def start(self) -> "MultiHostCluster":
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.net.start()
        try:
            head = self.head.address
            self.etcd_endpoint = self._forward(self.head, ETCD_CLIENT_PORT)
            self.etcd = EtcdProcess(self._etcd_dir, log_file=self.work_dir / "logs" / "etcd.log",
                                    die_with_parent=True, host=head, client_port=ETCD_CLIENT_PORT,
                                    peer_port=ETCD_PEER_PORT, prefix=self.head.prefix,
                                    health_endpoint=self.etcd_endpoint).start()
            etcd, registry = self.etcd.endpoint, f"{head}:{REGISTRY_PORT}"
            wait_ready([self._spawn("registry", self.head, "registry", "--port", str(REGISTRY_PORT), "--etcd", etcd)],
                       self.ready_timeout)
            self._spawn("profiler", self.head, "profiler", "--port", str(PROFILER_PORT), "--etcd", etcd,
                        "--registry", registry)
            # as deployed: the shared folder, at the same path on every host, is the planner's checkpoint root
            self._spawn("planner", self.head, "planner", "--port", str(PLANNER_PORT), "--etcd", etcd, "--registry",
                        registry, "--profiler", f"{head}:{PROFILER_PORT}", "--checkpoint-root", str(self.checkpoints))
            for node in NODES:
                h = self.host(node)
                self._spawn(node, h, "executor", "--port", str(EXECUTOR_PORT), "--advertise-host", h.address,
                            "--node-id", node, "--registry", registry,
                            "--slots", str(self.slots), "--ttl", str(self.ttl),
                            "--work-dir", str(self.work_dir / node), "--checkpoint-root", str(self.checkpoints))
            wait_ready([s for s in self.services.values() if not s.info], self.ready_timeout)
            self.planner = self._forward(self.head, PLANNER_PORT)
            self.registry = self._forward(self.head, REGISTRY_PORT)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Executors first, then the head's services, etcd, the forwarders, the namespaces."""
        for name in [*NODES, "planner", "profiler", "registry"]:
            if name in self.services:
                self.services[name].stop()
        if self.etcd is not None:
            self.etcd.stop()
        for f in self.forwards:
            f.stop()
        self.net.close()
        shutil.rmtree(self._etcd_dir, ignore_errors=True)

    def log(self, name: str, lines: int = 40) -> str:
        path = self.work_dir / "logs" / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    async def wait_nodes(self, count: int, timeout_s: float = 60.0) -> list[str]:
        """Node ids in the registry once there are count of them."""
        from omru.v1 import registry_pb2, registry_pb2_grpc
        from services.common.channels import open_channel

        async with open_channel(self.registry) as channel:
            stub = registry_pb2_grpc.RegistryServiceStub(channel)
            deadline = time.monotonic() + timeout_s
            while True:
                nodes = sorted(n.node_id for n in (await stub.ListNodes(registry_pb2.ListNodesRequest(), timeout=5)).nodes)
                if len(nodes) == count or time.monotonic() > deadline:
                    assert len(nodes) == count, f"registry lists {nodes}, not {count} nodes, after {timeout_s} s"
                    return nodes
                await asyncio.sleep(0.2)
