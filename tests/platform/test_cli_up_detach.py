"""`omru up --detach` end to end: the context it writes lets nodes, status, submit, watch and
profile run with no address given; `omru down` stops every process and removes the context."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from platform_helpers import alive, descendants

ENVS = ("OMRU_CONTEXT", "OMRU_PLANNER", "OMRU_REGISTRY", "OMRU_PROFILER", "OMRU_AUTH_TOKEN",
        "OMRU_TLS_CA", "OMRU_TLS_CERT", "OMRU_TLS_KEY")
TOKEN = "detached-secret"
TINY = """\
jobs:
  - id: tiny
    model: resnet18
    dataset: digits
    epochs: 1
    image_size: 8
    batch_size: 32
    train_samples: 64
    profile: {1: 1.0}
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A fresh environment: no address, token or context but the temp config folder's."""
    env = {k: v for k, v in os.environ.items() if k not in ENVS}
    env.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "cfg"), OMP_NUM_THREADS="1", **extra)
    return env


def omru(tmp_path: Path, *argv: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omru", *argv], capture_output=True, text=True, timeout=timeout,
                          env=_env(tmp_path, **extra))


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture
def detached(tmp_path):
    """`omru up --detach` (token set) in a temp config folder: its ready line, context and processes.

    Whatever the test does, the finalizer leaves nothing running: it stops the omru up the context
    named and kills every process it had started."""
    seen: dict[str, object] = {"pids": set(), "up": None}
    try:
        done = omru(tmp_path, "up", "--detach", "--nodes", "1", "--slots-per-node", "2", "--port", "0", "--ttl", "10",
                    timeout=240, OMRU_AUTH_TOKEN=TOKEN)
        assert done.returncode == 0, done.stderr
        ready = json.loads(done.stdout)
        path = tmp_path / "cfg" / "omru" / "context.json"
        ctx = json.loads(path.read_text())
        seen["up"] = ctx["pid"]
        seen["pids"] = {ctx["pid"], *descendants(ctx["pid"])}
        yield ready, path, ctx, seen["pids"]
    finally:
        up = seen["up"]
        if up and alive(up):
            os.kill(up, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while alive(up) and time.monotonic() < deadline:
                time.sleep(0.1)
        _kill(pid for pid in seen["pids"] if alive(pid))


def test_detached_cluster_is_found_through_the_context_and_stopped_by_down(detached, tmp_path):
    ready, path, ctx, pids = detached
    assert ready["ready"] is True and ready["context"] == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert {k: ctx[k] for k in ("planner", "registry", "profiler", "etcd", "metrics")} == \
        {k: ready[k] for k in ("planner", "registry", "profiler", "etcd", "metrics")}
    assert ctx["token"] == TOKEN and Path(ctx["log"]).is_file()
    assert os.getsid(ctx["pid"]) == ctx["pid"], "omru up runs in a session of its own"
    assert len(pids) >= 5  # omru up, etcd, registry, profiler, planner, executor

    nodes = omru(tmp_path, "nodes", "--json")  # no address, no token: both from the context
    assert nodes.returncode == 0, nodes.stderr
    (node,) = json.loads(nodes.stdout)["nodes"]
    assert node["node_id"] == "node-0" and node["address"] == ready["executors"][0]
    assert len(node["gpus"]) >= 1 and node["ttl_seconds"] == 10
    table = omru(tmp_path, "nodes")
    assert table.returncode == 0 and "node-0" in table.stdout, table.stderr

    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY)
    submitted = omru(tmp_path, "submit", str(workload))
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip() == "submitted 1 job(s): tiny"
    watched = omru(tmp_path, "watch", timeout=180)
    assert watched.returncode == 0, watched.stderr
    status = omru(tmp_path, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert [(j["job_id"], j["state"]) for j in json.loads(status.stdout)["jobs"]] == [("tiny", "FINISHED")]

    profiled = omru(tmp_path, "profile", "--model", "resnet18", "--dataset", "digits", "--gpus", "1",
                    "--image-size", "8", "--train-samples", "64", "--json", timeout=300)
    assert profiled.returncode == 0, profiled.stderr
    assert [p["gpus"] for p in json.loads(profiled.stdout)["points"]] == [1]

    wrong = omru(tmp_path, "status", OMRU_AUTH_TOKEN="not-the-token")  # env beats the context
    assert wrong.returncode == 2 and "UNAUTHENTICATED" in wrong.stderr, wrong.stderr

    again = omru(tmp_path, "up", "--detach", "--port", "0")
    assert again.returncode == 2 and "already running" in again.stderr

    down = omru(tmp_path, "down")
    assert down.returncode == 0, down.stderr
    assert f"pid {ctx['pid']}" in down.stdout
    assert not path.exists()
    assert not [pid for pid in pids if alive(pid)], "processes left behind"
    assert omru(tmp_path, "down").returncode == 3
    gone = omru(tmp_path, "status")
    assert gone.returncode == 3 and "cannot reach the planner at 127.0.0.1:50051" in gone.stderr


def test_a_detached_cluster_that_cannot_start_says_why(tmp_path):
    """No etcd at --etcd: the cluster's own error (exit 2, as in the foreground) and its log's tail."""
    busy = omru(tmp_path, "up", "--detach", "--nodes", "1", "--etcd", "127.0.0.1:1", "--port", "0", timeout=240)
    assert busy.returncode == 2, busy.stderr
    assert "exited with status 2" in busy.stderr and "up.log ends:" in busy.stderr and "before ready" in busy.stderr
    assert not (tmp_path / "cfg" / "omru" / "context.json").exists()
