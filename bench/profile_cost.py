"""What profiling costs next to the training it plans for.

Starts a local cluster (etcd, registry, profiler, one executor with 2 CPU
slots; real processes as `omru up` starts them), profiles every job of a
workload through the profiler service on 1 and 2 slots, the way the planner
asks for it (sampled iterations; jobs of one configuration share a profile),
and prints:

  profiling_s  wall time of all Profile calls, one after the other, from the
               first request to the last answer (process starts, warm-up,
               timed iterations, GPU hand-back: everything)
  training_s   a lower bound of the time the workload then trains on the
               cluster: sum over jobs of epochs x min_g(g x t(g)) / slots,
               with t(g) the measured epoch seconds (no plan can do better,
               so profiling_s / training_s over-states the overhead)

for a workload whose jobs train 20 epochs each (synthetic images, 8192
samples per epoch: a small real data set) and for the demo workload
(examples/demo.yaml). The per-job epoch times come from the same profiles;
bench/profile_accuracy.py shows how they compare with full-epoch timings.
Run: `.venv/bin/python bench/profile_cost.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench.profiling_cluster import profiling_cluster  # noqa: E402
from omru.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc  # noqa: E402
from services.common.channels import open_channel  # noqa: E402

SLOTS = 2


def twenty_epoch_workload(samples: int) -> list[common_pb2.JobSpec]:
    jobs = []
    for i, model in enumerate(("resnet18", "mobilenet_v3_small", "googlenet", "resnet18")):
        jobs.append(common_pb2.JobSpec(job_id=f"w20-{i}-{model}", model=model, dataset="synthetic", epochs=20, batch_size=32,
                                       base_lr=0.05, image_size=32, num_classes=10, train_samples=samples, seed=i))
    return jobs


def demo_workload() -> list[common_pb2.JobSpec]:
    from omru.workload import load
    from services.planner.convert import job_spec

    path = ROOT / "examples" / "demo.yaml"
    if not path.exists():
        raise SystemExit(f"demo workload {path.relative_to(ROOT)} is missing")
    return [job_spec(j) for j in load(str(path)).jobs]


async def profile_all(stub, jobs) -> tuple[float, dict[str, dict[int, float]], int]:
    began = time.monotonic()
    times: dict[str, dict[int, float]] = {}
    cached = 0
    for job in jobs:
        done = None
        async for reply in stub.Profile(profiler_pb2.ProfileRequest(job=job, max_gpus=SLOTS), timeout=1800):
            done = reply.progress
        if done.state != profiler_pb2.PROFILE_STATE_DONE:
            raise SystemExit(f"{job.job_id}: profiling failed: {done.message}")
        cached += done.cached
        times[job.job_id] = {p.gpus: p.epoch_seconds for p in done.profile.points}
    return time.monotonic() - began, times, cached


def training_lower_bound(jobs, times) -> float:
    cap = {j.job_id: j.max_gpus or SLOTS for j in jobs}
    return sum(j.epochs * min(g * t for g, t in times[j.job_id].items() if g <= cap[j.job_id]) for j in jobs) / SLOTS


async def main(args) -> int:
    with profiling_cluster(SLOTS) as cluster:
        async with open_channel(cluster["profiler"]) as channel:
            stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
            for name, jobs in (("20-epoch workload", twenty_epoch_workload(args.samples)), ("demo workload", demo_workload())):
                profiling_s, times, cached = await profile_all(stub, jobs)
                training_s = training_lower_bound(jobs, times)
                print(f"{name}: {len(jobs)} jobs ({cached} served from the store), epochs {[j.epochs for j in jobs]}")
                for j in jobs:
                    print(f"  {j.job_id:22} " + "  ".join(f"t({g})={t:.2f}s" for g, t in sorted(times[j.job_id].items())))
                print(f"  profiling_s {profiling_s:.1f}  training_s >= {training_s:.1f}  "
                      f"profiling / training <= {profiling_s / training_s:.1%} (target <= 5% for the 20-epoch workload)",
                      flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=8192, help="samples per epoch of the 20-epoch workload")
    raise SystemExit(asyncio.run(main(parser.parse_args())))
