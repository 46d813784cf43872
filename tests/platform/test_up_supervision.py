"""`omru up` restarts a child that dies (same argv and port, backoff, a limit)
instead of stopping the cluster: the policy and Supervisor on tiny fake
children, then the real `omru up` with its planner SIGKILLed."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.cluster import LocalCluster, RestartPolicy, ServiceProcess, Supervisor, child_env, pin_port
from platform_helpers import cmdline, descendants

# ---------------------------------------------------------------- policy and Supervisor, fake children

FAST = RestartPolicy(max_restarts=3, window_s=60.0, backoff_s=0.01, max_backoff_s=0.04)
#: A child that dies at once (exit 3); with READY_FIRST it prints a ready line (port 4242) first.
DIES = "import sys; sys.exit(3)"
READY_FIRST = "import json, sys; print(json.dumps({'ready': True, 'address': '127.0.0.1:4242', 'port': 4242}), flush=True); sys.exit(3)"


def _fake(tmp_path: Path, name: str, code: str) -> ServiceProcess:
    return ServiceProcess(name, [sys.executable, "-c", code, "--port", "0"], child_env(), tmp_path / f"{name}.log")


def _run_until_given_up(supervisor: Supervisor, timeout: float = 15.0) -> list[dict]:
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    while not supervisor.given_up:
        assert time.monotonic() < deadline, f"did not give up within {timeout} s: {events}"
        events += supervisor.step()
        time.sleep(0.01)
    return events


def test_restart_policy_backoff_doubles_to_a_cap_and_counts_only_the_window():
    policy = RestartPolicy()
    assert [policy.delay(k) for k in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert policy.recent([0.0, 10.0, 59.0], now=60.5) == 2  # the one at 0.0 is out of the 60 s window
    assert policy.recent([], now=0.0) == 0


def test_pin_port_replaces_port_zero_with_the_port_of_the_ready_line():
    argv = ["python", "-m", "services.planner.server", "--host", "127.0.0.1", "--port", "0", "--etcd", "127.0.0.1:2379"]
    assert pin_port(argv, {"address": "127.0.0.1:50123", "port": 50123}) == [*argv[:6], "50123", *argv[7:]]
    assert pin_port(argv, {"address": "127.0.0.1:50123"})[6] == "50123"
    fixed = [*argv[:6], "50051", *argv[7:]]
    assert pin_port(fixed, {"address": "127.0.0.1:50051"}) == fixed


def test_pin_port_keeps_the_metrics_port_a_restarted_child_had():
    argv = ["python", "-m", "services.registry.server", "--metrics-port", "0", "--port", "0"]
    info = {"address": "127.0.0.1:50123", "port": 50123, "metrics": "127.0.0.1:9311"}
    assert pin_port(argv, info) == [*argv[:3], "--metrics-port", "9311", "--port", "50123"]
    assert pin_port(argv, {"address": "127.0.0.1:50123"})[4] == "0"  # no metrics in the ready line: unchanged


def test_supervisor_backs_off_doubling_between_restarts(tmp_path):
    s = _fake(tmp_path, "flaky", DIES).spawn()
    supervisor = Supervisor({"flaky": s}, RestartPolicy(), ready_timeout=30)
    try:
        s.proc.wait(10)
        assert supervisor.step(now=100.0) == []  # exit noticed: restart due at 100.5
        first = s.proc
        assert supervisor.step(now=100.4) == [] and s.proc is first
        assert supervisor.step(now=100.5) == [] and s.proc is not first  # respawned (no ready line yet)
        assert supervisor.restarts("flaky") == 1
        s.proc.wait(10)
        supervisor.step(now=101.0)  # the restart died before its ready line: next in 1 s
        second = s.proc
        supervisor.step(now=101.9)
        assert s.proc is second
        supervisor.step(now=102.0)
        assert s.proc is not second and supervisor.restarts("flaky") == 2
    finally:
        s.kill()


def test_supervisor_gives_up_after_the_limit_on_a_child_that_dies_at_once(tmp_path):
    s = _fake(tmp_path, "flaky", DIES).spawn()
    supervisor = Supervisor({"flaky": s}, FAST, ready_timeout=10)
    try:
        events = _run_until_given_up(supervisor)
    finally:
        s.kill()
    assert supervisor.restarts("flaky") == 3
    assert len(events) == 1, events  # never ready again: no restarted line, then the exited line
    assert events[0]["ready"] is False and events[0]["exited"] == ["flaky"]
    assert "exited with code 3" in events[0]["reason"] and "3 restarts" in events[0]["reason"]


def test_supervisor_reports_each_restart_and_keeps_the_argv_with_the_port_pinned(tmp_path):
    s = _fake(tmp_path, "flaky", READY_FIRST)
    s.spawn()
    supervisor = Supervisor({"flaky": s}, FAST, ready_timeout=10)
    try:
        assert s.poll_ready() or _wait(lambda: s.poll_ready())
        argv = list(s.argv)
        events = _run_until_given_up(supervisor)
    finally:
        s.kill()
    restarted = [e for e in events if "restarted" in e]
    assert [(e["restarted"], e["exit_code"], e["restarts"]) for e in restarted] == [("flaky", 3, 1), ("flaky", 3, 2), ("flaky", 3, 3)]
    assert all(e["address"] == "127.0.0.1:4242" and e["pid"] > 0 for e in restarted)
    assert s.argv == [*argv[:-1], "4242"]  # the same argv, --port 0 pinned to the port it got
    assert events[-1]["exited"] == ["flaky"] and events[-1]["ready"] is False
    assert (tmp_path / "flaky.log").exists()


def test_local_cluster_supervise_returns_1_past_the_limit_and_0_on_stop(tmp_path):
    cluster = LocalCluster(nodes=0, work_dir=tmp_path)
    dying = _fake(tmp_path, "planner", DIES).spawn()
    cluster.services = [dying]
    events: list[dict] = []
    try:
        assert cluster.supervise(threading.Event(), events.append, RestartPolicy(max_restarts=0), interval=0.01) == 1
    finally:
        cluster.stop()
    assert events == [{"ready": False, "exited": ["planner"], "reason": events[0]["reason"]}]
    assert "planner exited with code 3" in events[0]["reason"]

    stop = threading.Event()
    stop.set()
    assert LocalCluster(nodes=0, work_dir=tmp_path).supervise(stop, events.append) == 0


def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


# ---------------------------------------------------------------- the real `omru up`


def _pid_of(up_pid: int, module: str) -> int:
    pids = [p for p, c in descendants(up_pid).items() if f"-m services.{module}.server " in c + " "]
    assert len(pids) == 1, f"{module}: {pids}"
    return pids[0]


class Up:
    """A running `omru up` with a line reader on its stdout."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("OMRU_AUTH_TOKEN", None)
        self.log = tmp_path / "up.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "omru", "up", "--port", "0", "--nodes", "1", "--slots-per-node", "1",
             "--no-warm-workers", "--work-dir", str(tmp_path / "work"), *args],
            stdout=subprocess.PIPE, stderr=open(self.log, "wb"), text=True, env=env, start_new_session=True,
        )
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.seen: set[int] = set()

    def line(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.seen |= set(descendants(self.proc.pid))
            if self.selector.select(0.2):
                line = self.proc.stdout.readline()
                if not line:
                    break
                return json.loads(line)
        raise AssertionError(f"no line within {timeout} s (exit {self.proc.poll()}); log:\n"
                             f"{self.log.read_text(errors='replace')[-3000:]}")

    def close(self) -> None:
        """Stop omru up and SIGKILL whatever it started that is still there."""
        self.seen |= set(descendants(self.proc.pid))
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.seen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.selector.close()
        self.proc.stdout.close()


@pytest.fixture
def up(tmp_path):
    started: list[Up] = []

    def start(*args: str) -> Up:
        started.append(Up(tmp_path, *args))
        return started[-1]

    yield start
    for u in started:
        u.close()


def _serving(address: str, timeout: float = 5.0) -> str:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="omru.v1.PlannerService"), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_omru_up_restarts_a_killed_planner_on_its_port_and_keeps_the_cluster(up):
    u = up()
    ready = u.line(60)
    assert ready["ready"] is True, ready
    assert _serving(ready["planner"]) == "SERVING"
    planner = _pid_of(u.proc.pid, "planner")
    old_argv = cmdline(planner)
    others = {p: c for p, c in descendants(u.proc.pid).items() if p != planner}
    assert "--port 0 " in old_argv + " "  # omru up --port 0: the planner got a free port

    os.kill(planner, signal.SIGKILL)
    restarted = u.line(30)
    assert restarted["restarted"] == "planner", restarted
    assert restarted["exit_code"] == -signal.SIGKILL and restarted["restarts"] == 1
    assert restarted["address"] == ready["planner"]
    new = _pid_of(u.proc.pid, "planner")
    assert new == restarted["pid"] != planner
    port = ready["planner"].rpartition(":")[2]
    metrics_port = ready["metrics"]["planner"].rpartition(":")[2]
    assert cmdline(new) == old_argv.replace("--port 0 ", f"--port {port} ").replace(
        "--metrics-port 0 ", f"--metrics-port {metrics_port} "), "same argv, ports pinned (its metrics' too)"

    assert _serving(ready["planner"]) == "SERVING"  # answers again on the same address
    assert u.proc.poll() is None, "omru up stopped"
    still = descendants(u.proc.pid)
    assert all(p in still for p in others), "the other children were not restarted or stopped"
    log = (Path(ready["work_dir"]) / "logs" / "planner.log").read_text(errors="replace")
    assert log.count("server_started") >= 2, "the restarted planner appends to the same log"


def test_omru_up_gives_up_past_max_restarts_and_stops_the_cluster(up):
    u = up("--max-restarts", "1", "--nodes", "0")
    ready = u.line(60)
    assert ready["ready"] is True, ready
    children = set(descendants(u.proc.pid))

    os.kill(_pid_of(u.proc.pid, "planner"), signal.SIGKILL)
    assert u.line(30)["restarted"] == "planner"
    os.kill(_pid_of(u.proc.pid, "planner"), signal.SIGKILL)
    gave_up = u.line(30)
    assert gave_up["ready"] is False and gave_up["exited"] == ["planner"], gave_up
    assert "planner exited with code -9" in gave_up["reason"] and "limit 1" in gave_up["reason"]
    assert u.proc.wait(30) == 1
    assert _wait(lambda: not any(cmdline(p) for p in children)), "children left behind"
