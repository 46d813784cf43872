"""A script job (examples/train_script.py, omru.elastic) is profiled through the profiler like a zoo job:
bounded timed trials on 1 and 2 slots, a stored profile keyed by the script, served again from the store."""

from __future__ import annotations

from pathlib import Path

from omru.v1 import common_pb2
from tests.executor.service_builders import executors
from tests.profiler.profiler_helpers import P, points, profile, profiler

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
