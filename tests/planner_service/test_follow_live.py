"""The planner carries a plan out on real (emulated) executors: a job moved to another node does not
train on both, and a GPU goes to the next job the plan names."""

from __future__ import annotations

import asyncio

from omru.v1 import planner_pb2
from services.common import config as cfg
from services.executor import server as executor_server
from services.executor.emulated import Emulation, EmulatedRuntime, emulated_gpus
from services.planner import report
from services.planner.core import registry as policies
from services.planner.core.model import Job, Plan, Segment
from services.emulator import measure
from tests.planner_service.planner_helpers import planner, spec

SPEED = 100.0


@policies.register("test-move-then-hand-over")
def _moves(problem):
    """a: its epochs but the last 4 on node-0's GPU (0), the last 4 on node-1's (1); b: on GPU 0 once a left
    it. Replans (with what runs as committed history) keep to it."""
    ids = {j.id for j in problem.jobs}
    free = [0.0, 0.0]
    for s in problem.options.get("committed", ()):
        for g in s.gpus:
            free[g] = max(free[g], s.end_s)
    segments = []
    if "a" in ids:
        a = problem.job("a")
        t, first = a.epoch_seconds(1), max(a.epochs - 4, 0)
        if first:
            segments.append(Segment("a", free[0], free[0] + first * t, (0,), first))
            free[0] += first * t
        start = max(free[0] if first else 0.0, free[1])
        segments.append(Segment("a", start, start + (a.epochs - first) * t, (1,), a.epochs - first))
    if "b" in ids:
        b = problem.job("b")
        segments.append(Segment("b", free[0], free[0] + b.epochs * b.epoch_seconds(1), (0,), b.epochs))
    return Plan("test-move-then-hand-over", tuple(segments))


async def emulated_node(node_id: str, registry_address: str, jobs, tmp_path, slots: int = 1):
    config = cfg.ExecutorConfig(node_id=node_id, server=cfg.ServerConfig(port=0), registry=registry_address,
                                slots=slots, ttl_seconds=5, work_dir=tmp_path / node_id,
                                warm_workers=False, checkpoint_root=tmp_path)
    runtime = EmulatedRuntime(Emulation({j.id: j for j in jobs}, speed=SPEED), node_id, slots)
    running, _ = await executor_server.start(config, runtime=runtime, node_gpus=emulated_gpus(slots))
    return running


async def run_to_the_end(stub, d, jobs, placements=()):
    """Submit `jobs` (their profiles, and spreads (job, GPUs, nodes, seconds)); wait until all finish."""
    await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(
        jobs=[spec(j.id, epochs=j.epochs, max_gpus=j.max_gpus) for j in jobs],
        profiles=[planner_pb2.JobProfile(job_id=j.id, epoch_seconds=dict(j.profile), placements=[
            planner_pb2.PlacementTime(gpus=g, nodes=k, epoch_seconds=t) for (g, k), t in j.placement.items()])
            for j in jobs]), timeout=5)
    for _ in range(300):
        if all(d.records[j.id].state == "FINISHED" for j in jobs):
            break
        await asyncio.sleep(0.1)
    return await d.state.events()


async def test_a_job_moved_to_another_node_trains_each_epoch_once_and_its_gpu_goes_to_the_next_planned(
        etcd, registry, tmp_path):
    jobs = [Job("a", 6, {1: 30.0}), Job("b", 3, {1: 30.0})]
    async with planner(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ckpt"),
                       policy="test-move-then-hand-over", time_scale=SPEED, start_overhead_s=0.0) as (running, d, stub):
        nodes = [await emulated_node(n, registry.address, jobs, tmp_path) for n in ("node-0", "node-1")]
        try:
            events = await run_to_the_end(stub, d, jobs)
        finally:
            for n in nodes:
                await n.stop(0)
    assert {j.id: d.records[j.id].state for j in jobs} == {"a": "FINISHED", "b": "FINISHED"}
    done = sorted((e.job_id, e.epoch) for e in events if e.kind == report.EPOCH_DONE)
    assert done == [("a", k) for k in range(1, 7)] + [("b", k) for k in range(1, 4)]  # each epoch once
    holds = report.holds(events)
    assert measure.double_owned_gpu_s(holds) == 0.0
    # as planned: a on node-0 then node-1; b on node-0 after a left it
    assert [(h.job_id, h.node_id) for h in sorted(holds, key=lambda h: h.start_s)] == [
        ("a", "node-0"), ("a", "node-1"), ("b", "node-0")]
    a0, a1 = [h for h in sorted(holds, key=lambda h: h.start_s) if h.job_id == "a"]
    assert a1.start_s >= a0.end_s  # the new node started once the old one had stopped


async def test_nodes_of_different_sizes_are_planned_as_they_are(etcd, registry, tmp_path):
    # 2 GPUs are fast on one node, slow over two: the job runs on the 2-GPU node's pair (planned as 3
    # nodes of 1 GPU, every pair would have looked spread and it would have run on 1 GPU)
    job = Job("a", 4, {1: 30.0, 2: 16.0, 3: 12.0}, placement={(2, 2): 60.0, (3, 2): 60.0})
    async with planner(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ckpt"),
                       time_scale=SPEED, start_overhead_s=0.0) as (running, d, stub):
        nodes = [await emulated_node(n, registry.address, [job], tmp_path, slots)
                 for n, slots in (("node-0", 2), ("node-1", 1))]
        try:
            for _ in range(100):  # both nodes known before the plan
                if len(d.nodes) == 2:
                    break
                await asyncio.sleep(0.05)
            events = await run_to_the_end(stub, d, [job])
        finally:
            for n in nodes:
                await n.stop(0)
    assert d.records["a"].state == "FINISHED"
    assert [(h.node_id, h.gpus) for h in report.holds(events)] == [("node-0", (("node-0", 0), ("node-0", 1)))]
