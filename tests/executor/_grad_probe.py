"""One rank of the gradient check: run as ``python _grad_probe.py RENDEZVOUS RANK OUT``.

Joins a 2-rank gloo group through the worker's own plumbing (TCPStore on rank
0, attempt prefix, DDP wrapper), computes on a rank-specific batch (a) the
local gradient of an unwrapped copy of the model and (b) the gradient DDP
leaves after its all-reduce, and saves both (tensors only) to OUT.
"""

import copy
import sys

import torch
import torch.nn.functional as F

from services.executor.worker import train, zoo
from services.executor.worker.spec import AttemptSpec


def main() -> None:
    rendezvous, rank, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    attempt = AttemptSpec("grad-probe", 2, rendezvous, checkpoint_dir=out + ".ck")
    device = train.init_distributed(attempt, rank)
    torch.manual_seed(0)
    model = zoo.build_model("resnet18", num_classes=10, image_size=32)
    local = copy.deepcopy(model)
    torch.manual_seed(100 + rank)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(10, (4,))
    F.cross_entropy(local(x), y).backward()
    ddp = train.wrap_ddp(model, device)
    F.cross_entropy(ddp(x), y).backward()
    torch.save({"local": [p.grad for p in local.parameters()], "ddp": [p.grad for p in model.parameters()]}, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
