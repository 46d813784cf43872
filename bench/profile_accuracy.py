"""How close sampled-iteration profiles come to full-epoch measurements.

Starts a local cluster (etcd, registry, profiler and one executor with CPU
slots, real processes as `omru up` starts them), then for each model profiles the same
configuration twice through the profiler service: sampled (warm-up
iterations dropped, median steady-state iteration x iterations per epoch)
and --full-epoch (one whole epoch timed), on 1..--gpus slots, alternating
the two --repeats times and keeping each method's fastest run (the machine
is shared: the least disturbed run is the truest), and prints both and the
relative error. Run: `.venv/bin/python bench/profile_accuracy.py
[--models a,b,c] [--train-samples N]` (OMP_NUM_THREADS=1 is set for the
workers).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from omru.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc  # noqa: E402
from services.common.channels import open_channel  # noqa: E402
from bench.profiling_cluster import profiling_cluster  # noqa: E402

DEFAULT_MODELS = "mobilenet_v3_small,resnet18,googlenet"


async def profile(stub, job, full_epoch: bool, gpus: int) -> dict[int, float]:
    request = profiler_pb2.ProfileRequest(job=job, gpu_counts=list(range(1, gpus + 1)), max_gpus=gpus, full_epoch=full_epoch,
                                          refresh=True)
    done = None
    async for reply in stub.Profile(request, timeout=1800):
        done = reply.progress
    if done.state != profiler_pb2.PROFILE_STATE_DONE:
        raise SystemExit(f"{job.model}: profiling failed: {done.message}")
    return {p.gpus: p.epoch_seconds for p in done.profile.points if p.measured}


async def main(args) -> int:
    models = [m for m in args.models.split(",") if m]
    began = time.monotonic()
    with profiling_cluster(max(args.slots, args.gpus)) as cluster:
        print(f"cluster ready in {time.monotonic() - began:.1f} s: 1 node x {args.slots} CPU slots")
        async with open_channel(cluster["profiler"]) as channel:
            stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
            print(f"{'model':22} {'gpus':>4} {'sampled_s':>10} {'full_epoch_s':>12} {'error':>7}   (min of {args.repeats} runs each)")
            worst = 0.0
            for model in models:
                job = common_pb2.JobSpec(job_id=f"acc-{model}", model=model, dataset=args.dataset, epochs=1,
                                         batch_size=args.batch_size, base_lr=0.05, image_size=args.image_size,
                                         num_classes=10, train_samples=args.train_samples, seed=1)
                runs: dict[bool, list[dict[int, float]]] = {False: [], True: []}
                for _ in range(args.repeats):  # alternate, so both methods see the same machine load
                    for full_epoch in (False, True):
                        runs[full_epoch].append(await profile(stub, job, full_epoch, args.gpus))
                best = {m: {g: min(r[g] for r in rs) for g in rs[0]} for m, rs in runs.items()}
                for g in sorted(best[True]):
                    sampled, full = best[False][g], best[True][g]
                    error = abs(sampled - full) / full
                    worst = max(worst, error)
                    print(f"{model:22} {g:>4} {sampled:>10.3f} {full:>12.3f} {error:>7.1%}", flush=True)
    print(f"worst error {worst:.1%} (target <= 10%); bench took {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--train-samples", type=int, default=512)
    parser.add_argument("--gpus", type=int, default=1, help="measure on 1..GPUS slots (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each method; the fastest counts (default 3)")
    raise SystemExit(asyncio.run(main(parser.parse_args())))
