"""Fencing end to end: a node whose lease lapses (paused, deregistered, etcd away) stops what it runs; an
executor's workers die with it; a planner gone right after its write leaves a job that runs once.

The probes of issue 19 on real processes (etcd, registry, planner, executor
processes, gloo workers), audited from the executors' own events: every
epoch is reported once and no GPU ever had two owners.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

from services.common.etcd import EtcdUnavailable
from services.planner import report
from tests.e2e.test_batch import record, run_until_done, start_nodes
from tests.e2e.test_faults import wait_epochs
from tests.planner_service.planner_helpers import planner
from tests.platform.platform_helpers import alive


def audit(events, jobs) -> None:
    """Every epoch of every job reported exactly once; no GPU held by two jobs at once."""
    for j in jobs:
        counts = collections.Counter(e.epoch for e in events if e.job_id == j.job_id and e.kind == "epoch_done")
        assert counts == collections.Counter(range(1, j.epochs + 1)), (j.job_id, counts)
    assert report.ownership_conflicts(report.holds(events)) == []


async def ready(d, gpus: int) -> None:
    for _ in range(150):
        if len(d.live_gpus()) == gpus:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the planner sees {len(d.live_gpus())} GPUs, not {gpus}")


def children(pid: int) -> set[int]:
    """Every process below pid (workers and their helpers)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(kids - found)
            found |= kids
    return found


async def test_an_executor_paused_past_its_lease_stops_its_work_and_nothing_trains_twice(
        etcd, registry, start_service, tmp_path):
    ttl = 3
    nodes = await start_nodes(start_service, registry, tmp_path, n=2, slots=1, ttl=ttl)
    jobs = [replace(record("j", 8, 0, samples=300), max_gpus=1)]  # on one node
    async with planner(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ckpt")) as (_, d, _stub):
        await ready(d, 2)
        await d.submit(jobs)
        victim = await wait_epochs(d, "j", 2)
        paused = nodes[int(victim.gpus[0][0].rsplit("-", 1)[1])]
        os.kill(paused.proc.pid, signal.SIGSTOP)  # the executor only: its worker trains on, reading the lease file
        try:
            moved = time.monotonic() + 60
            while time.monotonic() < moved:  # its lease lapses; the job goes to the other node
                r = await d.state.job("j")
                if r.gpus and r.gpus[0][0] != victim.gpus[0][0] and r.state == "RUNNING":
                    break
                await asyncio.sleep(0.3)
            else:
                raise AssertionError(f"the job did not move off the paused node: {r}")
        finally:
            os.kill(paused.proc.pid, signal.SIGCONT)
        done = await run_until_done(d, ["j"], timeout_s=240)
        events = await d.state.events()
        nodes_now = {g[0] for g in d.live_gpus()}
    assert done["j"].state == "FINISHED", done["j"]
    audit(events, jobs)
    assert nodes_now == {"node-0", "node-1"}  # the resumed node registered again


async def test_an_executor_killed_alone_takes_its_workers_with_it(etcd, registry, start_service, tmp_path):
    nodes = await start_nodes(start_service, registry, tmp_path, n=2, slots=1, ttl=3)
    jobs = [replace(record("j", 6, 0, samples=300), max_gpus=1)]
    async with planner(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ckpt")) as (_, d, _stub):
        await ready(d, 2)
        await d.submit(jobs)
        victim = await wait_epochs(d, "j", 1)
        killed = nodes[int(victim.gpus[0][0].rsplit("-", 1)[1])]
        workers = children(killed.proc.pid)
        assert workers, "no worker process under the executor"
        os.kill(killed.proc.pid, signal.SIGKILL)  # the executor alone, not its process group
        deadline = time.monotonic() + 10
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not [p for p in workers if alive(p)], "workers outlived their executor"
        done = await run_until_done(d, ["j"], timeout_s=240)
        events = await d.state.events()
    assert done["j"].state == "FINISHED", done["j"]
    # the killed attempt sent nothing after its executor died: every epoch is reported once
    audit(events, jobs)


async def test_jobs_finish_through_an_etcd_restart_and_nothing_trains_twice(etcd, registry, start_service, tmp_path):
    # etcd away for longer than the nodes' lease: their heartbeats fail, the planner's writes and event
    # stores fail; once it is back, events are replayed from the executors' logs and the jobs finish
    ttl = 3
    await start_nodes(start_service, registry, tmp_path, n=2, slots=1, ttl=ttl)
    jobs = [replace(record(f"j{i}", 4, i, samples=300), max_gpus=1) for i in range(2)]
    async with planner(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ckpt")) as (_, d, _stub):
        await ready(d, 2)
        d.policy_in_force = "parallel"  # one job per node
        await d.submit(jobs)
        await wait_epochs(d, "j0", 2)
        await asyncio.to_thread(etcd.stop)
        await asyncio.sleep(ttl + 2)
        await asyncio.to_thread(etcd.start)  # same ports, same data
        for _ in range(100):  # (the test's own reads: etcd's first answers after a start may time out)
            try:
                await d.state.jobs()
                break
            except EtcdUnavailable:
                await asyncio.sleep(0.2)
        done = await run_until_done(d, ["j0", "j1"], timeout_s=240)
        events = await d.state.events()
    assert {j: r.state for j, r in done.items()} == {"j0": "FINISHED", "j1": "FINISHED"}, done
    audit(events, jobs)


async def test_a_node_deregistered_mid_run_stops_its_work_and_nothing_trains_twice(
        etcd, registry, start_service, tmp_path):
    from omru.v1 import registry_pb2, registry_pb2_grpc
    from services.common.channels import open_channel

    await start_nodes(start_service, registry, tmp_path, n=2, slots=1, ttl=3)
    jobs = [replace(record("j", 6, 0, samples=300), max_gpus=1)]
    async with planner(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ckpt")) as (_, d, _stub):
        await ready(d, 2)
        await d.submit(jobs)
        victim = await wait_epochs(d, "j", 2)
        async with open_channel(registry.address) as channel:  # its lease revoked: its allocations go with it
            await registry_pb2_grpc.RegistryServiceStub(channel).DeregisterNode(
                registry_pb2.DeregisterNodeRequest(node_id=victim.gpus[0][0]), timeout=10)
        done = await run_until_done(d, ["j"], timeout_s=240)
        events = await d.state.events()
    assert done["j"].state == "FINISHED", done["j"]
    audit(events, jobs)
    assert len({e.attempt_id for e in events if e.job_id == "j" and e.kind == "started"}) >= 2  # it was stopped


async def test_a_job_allocated_by_a_planner_that_died_at_once_runs_once_under_the_next(
        etcd, registry, start_service, tmp_path):
    await start_nodes(start_service, registry, tmp_path, n=1, slots=1, ttl=4)
    ckpt = str(tmp_path / "ckpt")
    jobs = [replace(record("j", 3, 0, samples=300), max_gpus=1)]
    async with planner(etcd.endpoint, registry.address, checkpoint_root=ckpt) as (_, d, _stub):
        await ready(d, 1)
        change, written = d.state.change, asyncio.Event()

        async def then_hang(job_id, **kw):  # the planner's last act: the allocation write, then nothing
            result = await change(job_id, **kw)
            if kw.get("put") and result.succeeded:
                written.set()
                await asyncio.sleep(3600)
            return result

        d.state.change = then_hang
        await d.submit(jobs)
        await asyncio.wait_for(written.wait(), 60)
    # gone between its write and anything after it; the executor acts on the allocation alone
    async with planner(etcd.endpoint, registry.address, checkpoint_root=ckpt) as (_, d, _stub):
        done = await run_until_done(d, ["j"], timeout_s=180)
        events = await d.state.events()
    assert done["j"].state == "FINISHED", done["j"]
    audit(events, jobs)
    assert len({e.attempt_id for e in events if e.job_id == "j" and e.kind == "started"}) == 1  # not restarted
