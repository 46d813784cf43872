"""Epoch seconds of real DDP training on 1 and 2 CPU slots (gloo) here, and,
where CUDA is present, NCCL epoch seconds of resnet50 on the GPU(s).

    OMP_NUM_THREADS=1 .venv/bin/python bench/train_scaling.py [--epochs 2] [--skip-cpu] [--skip-gpu]

CPU part: resnet18 on digits at 32x32, 32 images per slot, the whole training
split (1,438 images) every epoch; prints the epoch seconds of every epoch and
the mean of the epochs after the first (the first one warms up allocators).
GPU part (profile mode "epoch": 5 warm-up iterations, then one timed epoch):
resnet50 on synthetic 224x224 images, 64 per GPU, 3,200 images per epoch, on
1 GPU and, if there are more, on all of them. A few minutes at most.
Figures, not pass/fail: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from services.executor.worker import launch  # noqa: E402
from services.executor.worker.spec import ProfileSpec, TrainSpec  # noqa: E402


def cpu_epochs(slots: int, epochs: int) -> list[float]:
    spec = TrainSpec(job_id=f"bench-cpu-{slots}", model="resnet18", dataset="digits", epochs=epochs, batch_size=32,
                     base_lr=0.02, base_batch=32, warmup_epochs=1, image_size=32)
    with tempfile.TemporaryDirectory() as ck:
        result = launch.run_attempt(spec, launch.new_attempt(slots, ck))
    if result.outcome != "finished":
        raise SystemExit(f"{slots}-slot run {result.outcome}: {result.message}")
    return [r["epoch_seconds"] for r in result.epochs]


def gpu_epoch(gpus: int) -> dict:
    spec = TrainSpec(job_id=f"bench-gpu-{gpus}", model="resnet50", dataset="synthetic", batch_size=64,
                     image_size=224, train_samples=3200, num_classes=1000)
    profile = ProfileSpec(mode="epoch", warmup_iters=5, measure_iters=1)
    with tempfile.TemporaryDirectory() as ck:
        attempt = launch.new_attempt(gpus, ck, devices=[str(i) for i in range(gpus)], profile=profile)
        result = launch.run_attempt(spec, attempt)
    if result.outcome != "profiled":
        raise SystemExit(f"{gpus}-GPU run {result.outcome}: {result.message}")
    return result.final


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--skip-gpu", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not args.skip_cpu:
        print(f"CPU slots (gloo), resnet18 digits 32x32, batch 32/slot, {os.cpu_count()} cores here")
        base = None
        for slots in (1, 2):
            secs = cpu_epochs(slots, args.epochs)
            steady = statistics.mean(secs[1:]) if len(secs) > 1 else secs[0]
            base = base or steady
            print(f"  {slots} slot(s): epoch seconds {', '.join(f'{s:.2f}' for s in secs)}; "
                  f"steady {steady:.2f} s; speed-up {base / steady:.2f}x", flush=True)
    if not args.skip_gpu:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            print("GPU: CUDA not available here; NCCL part skipped")
        else:
            print(f"GPU (NCCL), resnet50 synthetic 224x224, batch 64/GPU, 3200 images/epoch, "
                  f"{torch.cuda.get_device_name(0)}")
            for gpus in sorted({1, n}):
                p = gpu_epoch(gpus)
                print(f"  {gpus} GPU(s): epoch {p['epoch_seconds']:.2f} s, iteration {p['iter_seconds'] * 1000:.1f} ms, "
                      f"{p['samples_per_second']:.0f} images/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
