"""Faults end to end: the planner is killed and restarted mid-run, then an executor node dies.

Jobs continue after the planner restart (it resumes from etcd and the
executors' event logs); the dead node's job resumes from its checkpoint on
the remaining GPUs. No epoch is trained twice except the one a fault interrupted.
"""

from __future__ import annotations

import asyncio
import collections
import time

from tests.e2e.test_batch import record, run_until_done, start_nodes
from tests.planner_service.planner_helpers import planner


async def wait_epochs(d, job_id, n, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = await d.state.job(job_id)
        if r is not None and r.epochs_done >= n:
            return r
        await asyncio.sleep(0.3)
    raise AssertionError(f"{job_id} did not reach epoch {n} in {timeout_s} s")


async def test_jobs_survive_a_planner_restart_and_an_executor_death(etcd, registry, start_service, tmp_path):
    nodes = await start_nodes(start_service, registry, tmp_path, n=2, slots=2, ttl=4)
    ckpt = str(tmp_path / "ckpt")
    jobs = [record("j0", 6, 0, samples=300), record("j1", 6, 1, samples=300)]
    async with planner(etcd.endpoint, registry.address, checkpoint_root=ckpt) as (_, d, _stub):
        for _ in range(100):
            if len(d.live_gpus()) == 4:
                break
            await asyncio.sleep(0.1)
        d.policy_in_force = "parallel"  # both jobs at once, one node each
        await d.submit(jobs)
        await wait_epochs(d, "j0", 1)
    # the planner is gone; the workers keep training
    async with planner(etcd.endpoint, registry.address, checkpoint_root=ckpt) as (_, d, _stub):
        victim = await wait_epochs(d, "j1", 2)
        node = victim.gpus[0][0]
        nodes[int(node.rsplit("-", 1)[1])].kill()  # SIGKILL: its workers die with it, no clean release
        done = await run_until_done(d, ["j0", "j1"], timeout_s=240)
        events = await d.state.events()
        moved = await d.state.job(victim.job_id)
    assert {j: r.state for j, r in done.items()} == {"j0": "FINISHED", "j1": "FINISHED"}
    assert all(g[0] != node for g in moved.gpus), moved.gpus
    for j in jobs:
        counts = collections.Counter(e.epoch for e in events if e.job_id == j.job_id and e.kind == "epoch_done")
        assert set(counts) == set(range(1, j.epochs + 1)), (j.job_id, counts)
        twice = [ep for ep, c in counts.items() if c > 1]
        assert len(twice) <= (1 if j.job_id == victim.job_id else 0), (j.job_id, counts)

