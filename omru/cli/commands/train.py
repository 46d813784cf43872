"""`omru train`: run one training job on this machine through the executor's worker code.

Like torchrun: one worker process per slot (gloo on CPU slots, or NCCL with
``--gpus``), the linear scaling rule, a checkpoint every epoch (resumes from
``--checkpoint-dir`` when it holds one). ``--json`` prints one JSON record per
epoch and a final ``finished`` record with the accuracy.

``--resize EPOCH:SLOTS`` (repeatable) resizes the run once EPOCH epochs are
done, in place (the workers that stay keep their process and state, joiners
get it by broadcast; see services/executor/worker/train.py), or by a restart
from the checkpoint with ``--resize-by-restart``. Each resize prints its
pause (``resized`` records with ``pause_s`` under ``--json``).
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train one job on this machine (DDP over local slots)",
                              description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="zoo model, e.g. resnet18")
    p.add_argument("--dataset", default="digits", help="digits | synthetic | imagefolder:<dir> | clips:<dir>")
    p.add_argument("--slots", type=int, default=1, help="worker processes (CPU slots, or GPUs with --gpus)")
    p.add_argument("--gpus", action="store_true", help="one GPU per slot (NCCL) instead of CPU slots (gloo)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per slot")
    p.add_argument("--lr", type=float, default=0.02, help="base lr, for --base-batch")
    p.add_argument("--base-batch", type=int, default=None, help="global batch --lr is tuned for (default: --batch-size)")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--lr-decay", default="cosine", help="none | cosine")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--frames", type=int, default=0, help="clip length (video models)")
    p.add_argument("--num-classes", type=int, default=0, help="0 = from the data")
    p.add_argument("--train-samples", type=int, default=0, help="cap the training split (0 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None, help="keep checkpoints here (and resume from them)")
    p.add_argument("--job-id", default="train")
    p.add_argument("--resize", action="append", default=[], metavar="EPOCH:SLOTS",
                   help="once EPOCH epochs are done, go on with SLOTS slots, in place (repeatable)")
    p.add_argument("--resize-by-restart", action="store_true",
                   help="resize by stopping and restarting from the checkpoint instead (the old path)")
    p.add_argument("--json", action="store_true", help="JSON records instead of text")
    p.add_argument("--verbose", action="store_true", help="show the workers' stderr")
    p.set_defaults(func=handle)


def _spec(args):
    from omru.cli.main import CliError
    from services.executor.worker.spec import SpecError, TrainSpec

    if args.slots < 1:
        raise CliError(f"--slots must be >= 1, got {args.slots}")
    try:
        return TrainSpec(
            job_id=args.job_id, model=args.model, dataset=args.dataset, epochs=args.epochs,
            batch_size=args.batch_size, base_lr=args.lr,
            base_batch=args.batch_size if args.base_batch is None else args.base_batch,
            warmup_epochs=args.warmup_epochs, momentum=args.momentum, weight_decay=args.weight_decay,
            num_classes=args.num_classes, image_size=args.image_size, frames=args.frames,
            min_gpus=1, max_gpus=max(1, args.slots), seed=args.seed, train_samples=args.train_samples,
            lr_decay=args.lr_decay)
    except SpecError as exc:
        raise CliError(f"bad value: {exc}") from None


def parse_resizes(values: list[str], epochs: int) -> list[tuple[int, int]]:
    """--resize EPOCH:SLOTS values as (epoch, slots), by epoch; CliError naming a bad one."""
    from omru.cli.main import CliError

    plan: dict[int, int] = {}
    for value in values:
        epoch, sep, slots = value.partition(":")
        try:
            epoch_n, slots_n = int(epoch), int(slots)
        except ValueError:
            raise CliError(f"--resize {value!r}: must be EPOCH:SLOTS, two integers") from None
        if not sep:
            raise CliError(f"--resize {value!r}: must be EPOCH:SLOTS, two integers")
        if not 1 <= epoch_n < epochs:
            raise CliError(f"--resize {value!r}: the epoch must be 1..{epochs - 1} (epochs done when it resizes; "
                           f"--epochs is {epochs}), got {epoch_n}")
        if slots_n < 1:
            raise CliError(f"--resize {value!r}: slots must be >= 1, got {slots_n}")
        if epoch_n in plan:
            raise CliError(f"--resize {value!r}: epoch {epoch_n} is given twice")
        plan[epoch_n] = slots_n
    return sorted(plan.items())


def _text(record: dict) -> str | None:
    if record.get("event") == "epoch_done":
        return (f"epoch {record['epoch']}/{record['epochs']}  loss {record['loss']:.4f}  "
                f"test accuracy {100 * record['accuracy']:.2f}%  lr {record['lr']:.5f}  "
                f"world {record['world_size']} (batch {record['global_batch']})  {record['epoch_seconds']:.2f} s")
    if record.get("event") == "resized":
        how = "in place" if record["how"] == "in_place" else "by restart"
        return (f"resized {record['from_size']} -> {record['to_size']} {how} after epoch {record['epoch']}: "
                f"pause {record['pause_s']:.2f} s")
    if record.get("event") == "started" and record.get("rank") == 0:
        resumed = f", resumed at epoch {record['start_epoch']}" if record.get("resumed_from") else ""
        return f"started {record['world_size']} worker(s), {record['backend']}{resumed}"
    return None


def handle(args) -> int:
    spec = _spec(args)
    resizes = parse_resizes(args.resize, args.epochs)
    import tempfile

    from omru.cli.main import CliError
    from services.executor.worker import launch

    slots = max([args.slots, *(w for _, w in resizes)])
    if args.gpus:
        import torch

        if torch.cuda.device_count() < slots:
            raise CliError(f"--slots {slots} with --gpus needs {slots} GPUs, this machine has "
                           f"{torch.cuda.device_count()}")
    devices = [str(i) for i in range(slots)] if args.gpus else []
    tmp = None if args.checkpoint_dir else tempfile.TemporaryDirectory(prefix="omru-train-")
    ckpt_dir = args.checkpoint_dir or tmp.name
    try:
        def show(record: dict) -> None:
            if args.json:
                if record.get("event") in ("epoch_done", "resized", "failed"):
                    print(json.dumps(record), flush=True)
            else:
                line = _text(record)
                if line:
                    print(line, flush=True)

        stderr_to = sys.stderr if args.verbose else None
        if resizes:
            result = launch.run_local(spec, ckpt_dir, args.slots, resizes, devices,
                                      in_place=not args.resize_by_restart, on_record=show, stderr_to=stderr_to)
        else:
            attempt = launch.new_attempt(args.slots, ckpt_dir, devices)
            result = launch.run_attempt(spec, attempt, on_record=show, stderr_to=stderr_to)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if result.outcome != "finished":
        print(f"omru train: training {result.outcome}: {result.message}", file=sys.stderr)
        return 1
    final = result.final
    if args.json:
        print(json.dumps({k: v for k, v in final.items() if k != "history"}), flush=True)
    else:
        print(f"finished {final['epochs']} epochs in {final['seconds']:.1f} s: "
              f"test accuracy {100 * final['accuracy']:.2f}%")
    return 0
