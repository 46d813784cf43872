"""The pause of a resize, in place against by restart, and omru train's epoch time against plain DDP.

    OMP_NUM_THREADS=1 .venv/bin/python bench/resize_pause.py [--repeats 3] [--train-samples 0] [--gpus]

Pauses: for resnet18 and mobilenet_v3_small on digits (32x32, 32 images per
slot, seed 0), runs of 3 epochs resized 1->2 after epoch 1 and 2->1 after
epoch 2 (`launch.run_local`, as `omru train --resize 1:2 --resize 2:1`),
in place and by restart (`--resize-by-restart`: stop at the boundary,
checkpoint, new processes resume from it: the path before in-place
regroups). The pause is the worker's ``pause_s``: wall seconds from the last
optimizer step at the old size to the first at the new one (the epoch's
evaluation is in both). Median and all values of ``--repeats`` runs. Both
ways start workers from a warm pool as an executor keeps it (one waiting
worker per device; on CPU slots that is one for all slots, so a restart
onto 2 slots starts one rank cold).

Epoch time: ``omru train --slots 2 --epochs 3 --json`` against a plain DDP
loop of the same model, data, batch, sampler and optimizer, started like
torchrun (``python -m torch.distributed.run --nproc-per-node 2`` on this
script's ``--plain`` mode): the mean training seconds per epoch (slowest
rank, evaluation excluded) of the epochs after the first, the two run in
turn ``--repeats`` times (a shared machine's load drifts) and compared by
their medians: omru's overhead in per cent. With ``--gpus``: one GPU per
slot, NCCL.
Figures, not pass/fail: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODELS = ("resnet18", "mobilenet_v3_small")
BATCH = 32
IMAGE = 32
SEED = 0


def spec_for(model: str, epochs: int, train_samples: int):
    from services.executor.worker.spec import TrainSpec

    return TrainSpec(job_id=f"bench-{model}", model=model, dataset="digits", epochs=epochs, batch_size=BATCH,
                     base_lr=0.02, base_batch=BATCH, warmup_epochs=1, lr_decay="cosine", image_size=IMAGE,
                     train_samples=train_samples, seed=SEED)


def pauses(model: str, in_place: bool, train_samples: int, gpus: bool) -> tuple[dict[tuple[int, int], float], float]:
    """{(from, to): pause_s} of one run resized 1->2->1, and its final test accuracy."""
    from services.executor.worker import launch

    devices = ["0", "1"] if gpus else []
    with tempfile.TemporaryDirectory(prefix="omru-bench-") as ck:
        result = launch.run_local(spec_for(model, 3, train_samples), ck, 1, [(1, 2), (2, 1)], devices,
                                  in_place=in_place)
    if result.outcome != "finished":
        raise SystemExit(f"{model} ({'in place' if in_place else 'restart'}) {result.outcome}: {result.message}")
    return {(r["from_size"], r["to_size"]): r["pause_s"] for r in result.of("resized")}, result.final["accuracy"]


def omru_epochs(model: str, slots: int, epochs: int, train_samples: int, gpus: bool) -> list[float]:
    args = [sys.executable, "-m", "omru", "train", "--model", model, "--slots", str(slots), "--epochs", str(epochs),
            "--batch-size", str(BATCH), "--image-size", str(IMAGE), "--train-samples", str(train_samples),
            "--seed", str(SEED), "--json"] + (["--gpus"] if gpus else [])
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=_env(), check=False)
    if out.returncode != 0:
        raise SystemExit(f"omru train {model}: exit {out.returncode}: {out.stderr[-2000:]}")
    records = [json.loads(line) for line in out.stdout.splitlines()]
    return [r["epoch_seconds"] for r in records if r["event"] == "epoch_done"]


def plain_epochs(model: str, slots: int, epochs: int, train_samples: int, gpus: bool) -> list[float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(slots), "--master-port",
                str(_free_port()), os.path.abspath(__file__), "--plain", model, "--epochs", str(epochs),
                "--train-samples", str(train_samples), "--out", out.name] + (["--gpus"] if gpus else [])
        run = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=_env(), check=False)
        if run.returncode != 0:
            raise SystemExit(f"plain DDP {model}: exit {run.returncode}: {run.stderr[-2000:]}")
        with open(out.name) as f:
            return json.load(f)


def plain_ddp(model_name: str, epochs: int, train_samples: int, gpus: bool, out: str) -> None:
    """One rank of the plain loop (under torchrun): DDP, DistributedSampler, SGD; no omru in the loop."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from services.executor.worker import data, zoo

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if gpus:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    dist.init_process_group("nccl" if gpus else "gloo")
    torch.manual_seed(SEED)
    spec = spec_for(model_name, epochs, train_samples)
    splits = data.load(spec)
    model = zoo.build_model(model_name, splits.num_classes, IMAGE).to(device)
    ddp = DDP(model, device_ids=[device.index] if gpus else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.02 * world, momentum=0.9, weight_decay=5e-4)
    sampler = DistributedSampler(splits.train, num_replicas=world, rank=rank, shuffle=True, seed=SEED, drop_last=True)
    loader = DataLoader(splits.train, batch_size=BATCH, sampler=sampler, drop_last=True)
    seconds = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        t0 = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            float(loss.detach())  # (omru's loop reads the loss every step too)
        if gpus:
            torch.cuda.synchronize(device)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        seconds.append(float(t))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(seconds, f)
    dist.destroy_process_group()


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)}


def _free_port() -> int:
    from services.executor.worker.launch import free_port

    return free_port()


def _steady(seconds: list[float]) -> float:
    return statistics.mean(seconds[1:]) if len(seconds) > 1 else seconds[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-samples", type=int, default=0, help="cap digits' training split (0 = all 1,438)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--gpus", action="store_true", help="one GPU per slot (NCCL)")
    ap.add_argument("--skip-pauses", action="store_true")
    ap.add_argument("--skip-epochs", action="store_true")
    ap.add_argument("--plain", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain:
        plain_ddp(args.plain, args.epochs, args.train_samples, args.gpus, args.out)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    models = args.models.split(",")
    where = "GPUs (NCCL)" if args.gpus else f"CPU slots (gloo), {os.cpu_count()} cores"
    print(f"digits {IMAGE}x{IMAGE}, batch {BATCH}/slot, train samples {args.train_samples or 'all'}, "
          f"seed {SEED}, {where}")
    if not args.skip_pauses:
        print(f"resize pause_s, median of {args.repeats} runs (all values):")
        for model in models:
            for in_place in (True, False):
                runs = [pauses(model, in_place, args.train_samples, args.gpus) for _ in range(args.repeats)]
                how = "in place  " if in_place else "by restart"
                for step in ((1, 2), (2, 1)):
                    values = [r[step] for r, _ in runs]
                    print(f"  {model:<19} {step[0]}->{step[1]} {how} {statistics.median(values):6.2f} s  "
                          f"({', '.join(f'{v:.2f}' for v in values)})", flush=True)
                print(f"  {model:<19} {how} test accuracy after 3 epochs: "
                      f"{', '.join(f'{100 * a:.2f}%' for _, a in runs)}", flush=True)
    if not args.skip_epochs:
        print(f"epoch seconds on 2 slots, mean of epochs 2-{args.epochs}, median of {args.repeats} runs each, in turn "
              "(omru train vs plain DDP under torchrun):")
        for model in models:
            ours, plain = [], []
            for _ in range(args.repeats):
                ours.append(_steady(omru_epochs(model, 2, args.epochs, args.train_samples, args.gpus)))
                plain.append(_steady(plain_epochs(model, 2, args.epochs, args.train_samples, args.gpus)))
            a, b = statistics.median(ours), statistics.median(plain)
            print(f"  {model:<19} omru {a:6.2f} s ({', '.join(f'{v:.2f}' for v in ours)})  plain {b:6.2f} s "
                  f"({', '.join(f'{v:.2f}' for v in plain)})  overhead {100 * (a / b - 1):+.1f} %", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
