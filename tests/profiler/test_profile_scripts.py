"""A script job (examples/train_script.py, omru.elastic) is profiled through the profiler like a zoo job:
bounded timed trials on 1 and 2 slots, a stored profile keyed by the script, served again from the store.
A trial that overruns the profiler's time limit is stopped at once (the planner removes its allocation)
and gives its GPUs back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from omru.v1 import common_pb2, executor_pb2, profiler_pb2_grpc
from tests.executor.service_builders import K, executors
from tests.profiler.profiler_helpers import P, planner_for, points, profile, profiler

REPO = Path(__file__).resolve().parents[2]


def script_job(job_id: str, *args: str) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(job_id=job_id, command=["python", "examples/train_script.py", *args],
                              workdir=str(REPO), epochs=3, batch_size=16, base_lr=0.05, base_batch=16)


async def test_a_script_job_is_profiled_on_each_count_and_its_profile_is_keyed_by_the_script(etcd, registry, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2)) as (ex,), profiler(etcd.endpoint, registry.address) as stub:
        steps = await profile(stub, script_job("s1"))
        done = steps[-1]
        assert done.state == P.PROFILE_STATE_DONE and not done.cached
        measured = points(done)
        assert sorted(measured) == [1, 2] and all(m and t > 0 for t, m in measured.values())
        key = done.profile.key
        assert key.model.startswith("script-") and key.input_shape == "script" and key.batch_size == 16
        assert done.profile.points[0].steps == (2048 - 256) // 16  # the script's own loader, one rank

        again = await profile(stub, script_job("s2"))  # the same script: served from the store
        assert [s.state for s in again] == [P.PROFILE_STATE_DONE] and again[0].cached
        other = await profile(stub, script_job("s3", "--samples", "1024"), gpu_counts=[1], max_gpus=1)
        assert other[-1].state == P.PROFILE_STATE_DONE and not other[-1].cached  # another command: measured
        assert other[-1].profile.key.model != key.model


#: A script whose trial (3 warm-up + 10 timed iterations of 10 s) would take over two minutes.
SLOW = """import time

from omru import elastic

ctx = elastic.init()
for epoch in ctx.epochs():
    for i, batch in enumerate(ctx.batches(list(range(8)))):
        print("iteration", i, flush=True)
        time.sleep(10)
    ctx.report(epoch)
    ctx.save({})
"""


async def test_a_script_trial_that_overruns_the_time_limit_fails_and_is_stopped_at_once(etcd, registry, tmp_path):
    from services.common import config as cfg
    from services.common.channels import open_channel
    from services.common.etcd import EtcdStore
    from services.profiler import server
    from services.profiler.servicer import ProfilerServicer
    from services.planner.state import PlannerState
    from services.profiler.store import ProfileStore
    from services.profiler.trials import PlannerTrials

    (tmp_path / "slow.py").write_text(SLOW)
    job = common_pb2.JobSpec(job_id="slow", command=["python", "slow.py"], workdir=str(tmp_path), epochs=1,
                             batch_size=1, base_lr=0.1, base_batch=1)
    async with executors(registry.address, tmp_path, ("n1", 1)) as (ex,):
        store = EtcdStore(etcd.endpoint)
        await store.connect()
        trials = PlannerTrials(store, registry.address, trial_timeout_s=30)
        running = await server.start(cfg.ProfilerConfig(etcd=cfg.EtcdConfig(endpoint=etcd.endpoint),
                                                        registry=registry.address),
                                     ProfilerServicer(ProfileStore(store), trials))
        running.on_stop.extend([trials.close, store.close])
        events = ex.events()
        try:
            async with planner_for(etcd.endpoint, registry.address, running.address):
                async with open_channel(running.address) as channel:
                    steps = await profile(profiler_pb2_grpc.ProfilerServiceStub(channel), job, gpu_counts=[1],
                                          max_gpus=1)
                failed_at = time.monotonic()
                assert steps[-1].state == P.PROFILE_STATE_FAILED and "did not finish within 30 s" in steps[-1].message
                trial_id = (await events.wait_for(lambda e: e.job_id.startswith("slow.prof-g1-"), timeout=5)).job_id
                # the planner's removal of its allocation ends the timed iterations at once (not after two minutes)
                await events.wait_for(lambda e: e.job_id == trial_id and e.kind == K.EXECUTOR_EVENT_KIND_GPUS_RELEASED,
                                      timeout=15)
                assert time.monotonic() - failed_at < 15
                assert (await ex.job(trial_id)).phase == "stopped"
                log = b"".join([c.data async for c in ex.stub.GetLogs(executor_pb2.GetLogsRequest(job_id=trial_id),
                                                                       timeout=30)]).decode()
                assert "iteration 0" in log and "iteration 3" not in log  # stopped inside the timed iterations
                # and the planner gives its claim back once the executor released the GPU
                for _ in range(100):
                    if not await PlannerState(store).claims():
                        break
                    await asyncio.sleep(0.1)
                assert await PlannerState(store).claims() == {}
        finally:
            events.close()
            await running.stop(0)
