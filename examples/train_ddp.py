"""A plain DistributedDataParallel script, as written for torchrun: it knows nothing of OMRU.

    torchrun --nproc-per-node 2 examples/train_ddp.py --epochs 3
    # as an OMRU job: command: [python, examples/train_ddp.py, --epochs, "3"]

It reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), trains a small classifier on a synthetic data set and, after
every epoch, checkpoints atomically to $OMRU_CHECKPOINT_DIR (./checkpoints
without it), from which it resumes: that is all OMRU needs to stop it and
restart it on other GPUs. OMRU sees it only start and exit (0 = finished);
examples/train_script.py does the same with omru.elastic and reports every
epoch.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="at a global batch of 32")
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()

    cuda = torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "") != ""
    dist.init_process_group("nccl" if cuda else "gloo")  # from MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 32, generator=g)
    y = (x @ torch.randn(32, 4, generator=g)).argmax(1)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr * args.batch_size * world / 32, momentum=0.9)

    folder = os.environ.get("OMRU_CHECKPOINT_DIR", "checkpoints")
    path = os.path.join(folder, "last.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["epoch"]
        if rank == 0:
            print(f"resumed at epoch {start}", flush=True)

    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        total = count = 0.0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = F.cross_entropy(ddp(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, count = total + float(loss.detach()) * len(yb), count + len(yb)
        if rank == 0:
            os.makedirs(folder, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1}, path + ".tmp")
            os.replace(path + ".tmp", path)  # atomic: a stop never leaves half a checkpoint
            print(f"epoch {epoch + 1}/{args.epochs} loss {total / count:.4f} world {world}", flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
