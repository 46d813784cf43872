"""A cluster for the profiling benches: etcd, registry, profiler and one
executor with CPU slots, each a real process started the way `omru up`
starts them (services.common.cluster), without the planner."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.cluster import EtcdProcess, ServiceProcess, child_env, service_argv, wait_ready  # noqa: E402


@contextlib.contextmanager
def profiling_cluster(slots: int):
    """Yields {"profiler": address, "registry": address, "executor": address}."""
    with tempfile.TemporaryDirectory(prefix="omru-bench-") as tmp:
        work = Path(tmp)
        etcd = EtcdProcess(work / "etcd", log_file=work / "etcd.log").start()
        started: list[ServiceProcess] = []

        def start(name: str, module: str, *args: str) -> ServiceProcess:
            s = ServiceProcess(name, service_argv(module, "--port", "0", *args), child_env(), work / f"{name}.log").spawn()
            started.append(s)
            return s

        try:
            registry = start("registry", "registry", "--etcd", etcd.endpoint)
            wait_ready([registry], 60)
            profiler = start("profiler", "profiler", "--etcd", etcd.endpoint, "--registry", registry.address)
            executor = start("executor", "executor", "--node-id", "node-0", "--registry", registry.address,
                             "--slots", str(slots), "--work-dir", str(work / "node-0"))
            wait_ready([profiler, executor], 60)
            yield {"profiler": profiler.address, "registry": registry.address, "executor": executor.address}
        finally:
            for s in reversed(started):
                s.stop()
            etcd.stop()
