"""A training script that uses omru.elastic: it resizes at epoch boundaries and reports every epoch.

    python examples/train_script.py                     # alone on this machine
    # as an OMRU job (workload YAML):
    #   command: [python, examples/train_script.py]
    #   epochs: 6
    #   batch_size: 32                                  # per GPU
    #   base_lr: 0.05
    #   base_batch: 32

omru.elastic gives the process group, the rank's device, the linear scaling
rule for the current global batch, atomic checkpoints in the job's folder and
the epochs still to run: when the planner moves the job to more (or fewer)
GPUs, `ctx.epochs()` ends after the epoch in progress has been saved, the
executor starts the script again on the new GPUs, `ctx.load()` resumes it
there, and `ctx.scale_lr` gives the lr of the new global batch. Every
`ctx.report` shows in `omru watch`; in a profiling trial `ctx.batches` times
a few iterations and ends the process, so the planner knows the script's
speed on 1, 2, 4, ... GPUs.
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from omru import elastic


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--fail", default="", help="raise this error at the start (to show failure reasons)")
    args = parser.parse_args()

    ctx = elastic.init(epochs=3, batch_size=32)  # (these two only outside OMRU: the job spec sets them)
    if args.fail:
        raise RuntimeError(args.fail)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 32, generator=g)
    y = (x @ torch.randn(32, 4, generator=g)).argmax(1)
    train, test = TensorDataset(x[256:], y[256:]), TensorDataset(x[:256], y[:256])
    sampler = DistributedSampler(train, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=ctx.batch_size, sampler=sampler, drop_last=True)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(ctx.device)
    ddp = DistributedDataParallel(model, device_ids=ctx.device_ids)
    base_lr = float(os.environ.get("OMRU_BASE_LR", 0.05))
    base_batch = int(os.environ.get("OMRU_BASE_BATCH", 32))
    opt = torch.optim.SGD(ddp.parameters(), lr=base_lr, momentum=0.9)
    state = ctx.load()
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        print(f"rank {ctx.rank}: resumed at epoch {ctx.start_epoch} on {ctx.world_size} ranks", flush=True)

    for epoch in ctx.epochs():
        lr = ctx.scale_lr(base_lr, base_batch)  # base_lr x global batch / base_batch
        for group in opt.param_groups:
            group["lr"] = lr
        sampler.set_epoch(epoch)
        total = count = 0.0
        for xb, yb in ctx.batches(loader):
            xb, yb = xb.to(ctx.device), yb.to(ctx.device)
            loss = F.cross_entropy(ddp(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, count = total + float(loss.detach()) * len(yb), count + len(yb)
        with torch.no_grad():
            accuracy = float((model(test.tensors[0].to(ctx.device)).argmax(1).cpu() == test.tensors[1]).float().mean())
        loss_sum, seen = elastic.all_reduce([total, count], ctx.device)
        ctx.report(epoch, loss=loss_sum / seen, accuracy=accuracy, lr=lr)
        ctx.save({"model": model.state_dict(), "optimizer": opt.state_dict()})
        if ctx.rank == 0:
            print(f"epoch {epoch + 1}/{ctx.epochs_total} loss {loss_sum / seen:.4f} accuracy {accuracy:.3f} "
                  f"lr {lr:.4f} world {ctx.world_size}", flush=True)


if __name__ == "__main__":
    main()
