"""The emulated cluster: the real control plane, emulated work (`omru emulate`).

`EmulatedCluster` starts etcd, the registry, the profiler and the planner as
the processes `omru up` starts (services/common/cluster.py), and N emulated
nodes, `nodes_per_process` to a process (services/executor/emulated.py): each
a real ExecutorService with its own port and registry lease. `run` submits the
profiled jobs through the planner's gRPC API at their arrivals (arrival_s /
speed after the start), waits until every job is finished, failed or
cancelled, and measures the run (`measure`).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import resource
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from services.common.cluster import DIE_WITH_PARENT_ENV, LocalCluster, ServiceProcess, child_env, wait_ready
from services.planner.core.model import Job

#: What one emulation may hold on this kind of machine (2 cores): the control plane is real.
MAX_NODES = 512
MAX_GPUS = 4096
#: Jobs per SubmitJobs (etcd allows 128 operations per transaction; the planner creates them in one).
SUBMIT_CHUNK = 100
#: Placements submitted per GPU count: those over at most this many nodes more than the fewest that hold it.
SUBMITTED_SPREAD = 2
#: Wall seconds between the emulator's looks at the job records (a list of 1,000 is 6 MB of etcd reads:
#: the instrument must not load what it measures). Makespans come from events, not from these looks.
POLL_S = 2.0
KILL_POLL_S = 0.2  # while waiting for the moment to kill a node process
#: Seconds every RPC of the emulator may take.
RPC_DEADLINE_S = 30.0


@dataclass(frozen=True)
class EmulationConfig:
    profiles: str  # the CSV (omru simulate's contract)
    nodes: int
    gpus_per_node: int
    policy: str
    speed: float
    task: str | None = None
    noise: float = 0.0
    resize_cost_s: float = 0.0
    seed: int = 0
    nodes_per_process: int = 64
    ttl_seconds: int = 5
    timeout_s: float = 3600.0  # wall seconds the jobs may take before the run gives up

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.nodes <= MAX_NODES:
            problems.append(f"--nodes {self.nodes} is not in 1..{MAX_NODES}")
        if not 1 <= self.gpus_per_node <= 64:
            problems.append(f"--gpus-per-node {self.gpus_per_node} is not in 1..64")
        elif self.nodes * self.gpus_per_node > MAX_GPUS:
            problems.append(f"{self.nodes} nodes x {self.gpus_per_node} GPUs = {self.nodes * self.gpus_per_node} "
                            f"GPUs, more than the emulator holds here ({MAX_GPUS})")
        if not (math.isfinite(self.speed) and self.speed > 0):
            problems.append(f"--speed {self.speed!r} must be a positive number")
        if not (math.isfinite(self.noise) and self.noise >= 0):
            problems.append(f"--noise {self.noise!r} must be >= 0")
        if not (math.isfinite(self.resize_cost_s) and self.resize_cost_s >= 0):
            problems.append(f"--resize-cost {self.resize_cost_s!r} must be >= 0")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def etcd_requests(endpoint: str) -> float:
    """gRPC messages etcd received so far (its /metrics), requests and stream messages alike."""
    try:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(float(m.group(1)) for m in re.finditer(r"^grpc_server_msg_received_total\{[^}]*\} (\S+)$", text, re.M))


@dataclass
class EmulatedCluster:
    """The processes of one emulation (a context manager)."""

    config: EmulationConfig
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="omru-emulate-")))
    keep: bool = False  # keep work_dir (logs, etcd data, checkpoints) after the run
    control: LocalCluster | None = None
    node_processes: list[ServiceProcess] = field(default_factory=list)

    def start(self) -> "EmulatedCluster":
        c = self.config
        self.control = LocalCluster(
            nodes=0, planner_port=0, work_dir=self.work_dir, ttl_seconds=c.ttl_seconds, die_with_parent=True,
            planner_args=("--policy", c.policy, "--time-scale", repr(c.speed), "--start-overhead", repr(c.resize_cost_s),
                          "--checkpoint-root", str(self.work_dir / "checkpoints")))
        try:
            self.control.start()
            registry = self.control.service("registry").address
            ids = [f"node-{i}" for i in range(c.nodes)]
            for p, first in enumerate(range(0, c.nodes, c.nodes_per_process)):
                argv = [
                    sys.executable, "-m", "services.executor.emulated",
                    "--registry", registry, "--node-ids", ",".join(ids[first:first + c.nodes_per_process]),
                    "--gpus-per-node", str(c.gpus_per_node), "--profiles", str(Path(c.profiles).resolve()),
                    "--speed", repr(c.speed), "--noise", repr(c.noise), "--resize-cost", repr(c.resize_cost_s),
                    "--seed", str(c.seed), "--ttl", str(c.ttl_seconds), "--work-dir", str(self.work_dir / "nodes"),
                    "--checkpoint-root", str(self.work_dir / "checkpoints"),
                    *(["--task", c.task] if c.task else [])]
                s = ServiceProcess(f"emulated-{p}", argv, child_env({DIE_WITH_PARENT_ENV: "1"}),
                                   self.work_dir / "logs" / f"emulated-{p}.log")
                self.node_processes.append(s.spawn())
            # each process parses the whole profile CSV first (1,000 jobs: 2.56 M rows, about a minute of
            # CPU each), and they share the machine's cores
            wait_ready(self.node_processes, 120.0 + 60.0 * len(self.node_processes))
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def planner(self) -> str:
        return self.control.service("planner").address

    @property
    def etcd(self) -> str:
        return self.control.etcd_endpoint

    def nodes_of(self, process: int) -> list[str]:
        return list(self.node_processes[process].info["nodes"])

    def kill_node_process(self, process: int) -> list[str]:
        """SIGKILL one process of emulated nodes (their leases lapse, nothing is deregistered); its node ids."""
        nodes = self.nodes_of(process)
        self.node_processes[process].kill()
        return nodes

    def cpu_seconds(self) -> dict[str, float]:
        def of(process) -> float:
            return cpu_seconds(process.pid) if process is not None else 0.0

        nodes = sum(of(s.proc) for s in self.node_processes)
        me = resource.getrusage(resource.RUSAGE_SELF)
        return {"planner_cpu_s": of(self.control.service("planner").proc),
                "registry_cpu_s": of(self.control.service("registry").proc),
                "etcd_cpu_s": of(self.control.etcd.proc if self.control.etcd else None),
                "emulator_cpu_s": nodes + me.ru_utime + me.ru_stime}

    def planner_plan_seconds(self) -> list[float]:
        """Wall seconds of each plan the planner made (its log's `planned` lines)."""
        out = []
        log = self.work_dir / "logs" / "planner.log"
        if log.exists():
            for line in log.read_text(errors="replace").splitlines():
                if '"planned"' in line:
                    try:
                        out.append(float(json.loads(line)["plan_s"]))
                    except (ValueError, KeyError):
                        pass
        return out

    def stop(self) -> None:
        for s in self.node_processes:
            s.stop()
        if self.control is not None:
            self.control.stop(keep_logs=True)
        if not self.keep:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "EmulatedCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def submission(jobs: Sequence[Job], gpus_per_node: int):
    """The SubmitJobsRequest of some profiled jobs: synthetic training specs, the CSV's epoch times.

    A profile lists only the GPU counts whose time differs from the count
    below (the planner takes an unlisted count's time from the nearest count
    below it, so nothing is lost), and, of those counts, the placements a user
    would measure: up to SUBMITTED_SPREAD nodes more than the fewest that hold
    the GPUs (a batch of 1,000 Pollux jobs on 1,024 GPUs has 1,536 placement
    rows per job; the planner keeps each job's profile in one etcd record).
    A job's largest count in the CSV is its max_gpus. The emulated nodes run
    every placement at the CSV's time.
    """
    from omru.v1 import planner_pb2
    from omru.workload import WorkloadJob
    from services.executor.worker.spec import TrainSpec
    from services.planner import convert

    specs, profiles = [], []
    for j in jobs:
        specs.append(convert.job_spec(WorkloadJob(spec=TrainSpec(job_id=j.id, model="resnet18", dataset="synthetic",
                                                                 epochs=j.epochs), max_gpus=j.max_gpus)))
        times, last = {}, None
        for g, t in sorted(j.profile.items()):
            if t != last:
                times[g] = t
            last = t
        profiles.append(planner_pb2.JobProfile(job_id=j.id, epoch_seconds=times, placements=[
            planner_pb2.PlacementTime(gpus=g, nodes=k, epoch_seconds=t) for (g, k), t in j.placement.items()
            if g in times and k <= -(-g // gpus_per_node) + SUBMITTED_SPREAD]))
    return planner_pb2.SubmitJobsRequest(jobs=specs, profiles=profiles)


async def drive(cluster: EmulatedCluster, jobs: Sequence[Job], kill_process_at: float | None = None) -> dict:
    """Submit the jobs at their arrivals, wait for them all; what happened, in wall seconds.

    kill_process_at: SIGKILL emulated-node process 0 once this share of all
    epochs is done (the test of a lost process)."""
    from omru.v1 import planner_pb2_grpc
    from services.common.channels import open_channel
    from services.common.etcd import EtcdStore
    from services.planner.state import PlannerState

    speed = cluster.config.speed
    store = EtcdStore(cluster.etcd)
    await store.connect()
    state = PlannerState(store)
    channel = open_channel(cluster.planner)
    stub = planner_pb2_grpc.PlannerServiceStub(channel)
    etcd_before = etcd_requests(cluster.etcd)
    cpu_before = cluster.cpu_seconds()  # the run's own: not the start-up (each node process reads the profiles)
    origin = time.time()
    killed: list[str] = []
    total_epochs = sum(j.epochs for j in jobs)
    try:
        pending = sorted(jobs, key=lambda j: (j.arrival_s, j.id))
        deadline = time.monotonic() + cluster.config.timeout_s
        while True:
            now = time.time()
            due = [j for j in pending if origin + j.arrival_s / speed <= now]
            pending = pending[len(due):]
            await asyncio.gather(*(stub.SubmitJobs(submission(due[i:i + SUBMIT_CHUNK], cluster.config.gpus_per_node),
                                                   timeout=RPC_DEADLINE_S) for i in range(0, len(due), SUBMIT_CHUNK)))
            records = await state.jobs()
            if kill_process_at is not None and not killed:
                if sum(r.epochs_done for r in records) >= kill_process_at * total_epochs:
                    killed = cluster.kill_node_process(0)
            if not pending and len(records) == len(jobs) and all(r.terminal for r in records):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs not done within {cluster.config.timeout_s:.0f} s: "
                                   + ", ".join(sorted(f"{r.job_id} {r.state}" for r in records if not r.terminal)[:10]))
            poll = KILL_POLL_S if kill_process_at is not None and not killed else POLL_S
            next_arrival = (origin + pending[0].arrival_s / speed - time.time()) if pending else poll
            await asyncio.sleep(max(0.0, min(poll, next_arrival)))
        wall = time.time() - origin
        return {"origin": origin, "wall_s": wall, "records": records, "events": await state.events(),
                "first_plan": await state.first_plan(), "killed_nodes": killed,
                "etcd_requests": etcd_requests(cluster.etcd) - etcd_before,
                "cpu_s": {k: v - cpu_before[k] for k, v in cluster.cpu_seconds().items()}}
    finally:
        await channel.close()
        await store.close()
