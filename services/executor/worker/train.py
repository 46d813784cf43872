"""The training worker: one process per GPU or CPU slot, one rank of a DDP job.

Run as ``python -m services.executor.worker --spec-json JSON --rank R
[--records PATH]``, where JSON is ``spec.to_json(TrainSpec, AttemptSpec)``,
or as ``python -m services.executor.worker --standby``, which imports torch
first and then reads those arguments from stdin as one JSON list (a warm
worker: services/executor/worker/warm.py). Launchers normally use
`services.executor.worker.launch`.

What it does: rendezvous through the c10d TCPStore that rank 0 hosts at
``attempt.rendezvous`` (port 0: at the port rank 0 writes to
``attempt.rendezvous_file``) under the prefix ``attempt.attempt_id``, NCCL on a GPU
rank (``cuda:0`` of its ``CUDA_VISIBLE_DEVICES``) or gloo on a CPU rank (one
thread). Resume from the newest checkpoint in ``checkpoint_dir`` if there is
one (on any world size), otherwise start from a model seeded with
``spec.seed``. Each epoch: DistributedSampler (seeded, ``set_epoch``),
DistributedDataParallel SGD with the linear scaling rule (`lsr`), evaluation
of the held-out split sharded over the ranks and all-reduced, a checkpoint
written by rank 0, an ``epoch_done`` record. After each epoch boundary the
ranks all-reduce "stop requested" (the stop file exists or SIGUSR1 arrived);
if any rank saw it, all stop there (checkpoint already written) and exit 0.

Resizes in place (``attempt.resizes`` with ``in_place``; a planned resize
without it stops the job there, for the launcher to restart it at the new
size from the checkpoint). At the boundary where the plan changes the size,
rank 0 writes the epoch's checkpoint from a copy of the state in a background
thread (`omru.elastic.Context.save`), and at the start of the next epoch
every rank destroys its process group; ranks at or above the new size leave
(exit 0), the others, with the joiners the launcher starts (``generation``
n > 0), form the group of generation n under the store prefix
``<attempt_id>/gen<n>`` (the same TCPStore, rank 0's), rank 0 broadcasts model,
optimizer, lr schedule, epoch and history when the group grew
(`broadcast_state`, as checkpoint bytes), the lr follows the new global batch (`omru.lsr.resumed`:
a one-epoch ramp to the new target) and the sampler is rebuilt for the new
size. Nothing is read from disk. A rank that dies (or a timeout) during the
regroup fails the attempt; the launcher then restarts from the checkpoint
(`launch.run_local`).
Epochs, checkpoints, stop requests, reports and profiling trials go through
`omru.elastic`, the library a user's own training script uses.

Record stream
-------------
The worker talks to its parent only through records, one JSON object per line
after `omru.elastic.RECORD_PREFIX`, written to stdout (``--records -``, the default; anything else the process
prints goes to stderr) or appended to the file ``--records PATH``. Every record
has ``event``, ``job_id``, ``attempt_id``, ``rank`` and ``time`` (Unix
seconds). Only rank 0 writes ``epoch_done``, ``stopped``, ``finished`` and
``profile``; every rank writes ``started`` and, on an error, ``failed``.

``started``    pid, world_size, backend ("gloo"/"nccl"), device,
               start_epoch (epochs already done, from a checkpoint),
               epochs, global_batch, lr (the lr at start_epoch), resumed_from
               (checkpoint path or null; lr and resumed_from: zoo jobs only)
``epoch_done`` epoch (1-based: epochs completed now), epochs, epoch_seconds
               (training wall time of the epoch, slowest rank), eval_seconds,
               loss (mean training loss), train_accuracy, test_loss,
               accuracy (held-out accuracy, 0..1), lr (lr of the epoch's last
               iteration), world_size, global_batch, steps, checkpoint (path)
``stopped``    epoch (epochs completed; the next attempt resumes here)
``finished``   epochs, accuracy, test_loss, loss, seconds (this attempt),
               history (every epoch_done record of the job, across attempts)
``profile``    mode ("sampled"/"epoch"), iter_seconds (steady state, slowest
               rank), iters (measured), warmup_iters, epoch_seconds (measured in
               "epoch" mode, iter_seconds x steps in "sampled" mode), steps
               (iterations per epoch), world_size, global_batch,
               samples_per_second, device
``failed``     message (exception type and text)
``regroup``    (rank 0, an in-place resize begins) epoch (epochs done),
               from_size, to_size, generation
``joining``    (a joiner, before its rendezvous) pid, generation
``left``       (a rank that a shrink ends) epoch, generation
``resized``    (rank 0, after the first optimizer step at a new size) epoch
               (epochs done at the resize), from_size, to_size, how
               ("in_place"/"restart"), pause_s (wall seconds from the last
               optimizer step at the old size to the first at the new one: the
               gap between two consecutive steps, so one iteration's work is in
               it; restart: Unix times of two processes), regroup_s (in place:
               teardown to ready), lr (at that step)
``samples``    (every rank, only with OMRU_SAMPLE_IDS=1 in its environment)
               epoch, ids (the indices into the train split it trained on)

``epoch_done`` also has first_step_at and last_step_at (Unix times of rank
0's first and last optimizer step of the epoch).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback

from omru import elastic
from omru.elastic import Records, all_reduce

#: Environment variable: with "1" every rank reports the sample ids it trained on each epoch.
SAMPLE_IDS_ENV = "OMRU_SAMPLE_IDS"


def _open_records(target: str):
    if target == "-":
        stream = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)  # stray prints (ours, torch's, C code's) go to stderr
        sys.stdout = sys.stderr
        return stream
    return open(target, "a", buffering=1)


# --- distributed plumbing (also used by tests/executor/_grad_probe.py) -------------------


def select_device(device: str):
    """torch.device for one rank's ``devices`` entry; sets threads / current GPU."""
    import torch

    if device == "cpu":
        torch.set_num_threads(1)
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"rank device {device!r} is a GPU but CUDA is not available here")
    index = 0 if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() == device else int(device)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init_distributed(attempt, rank: int):
    """Join the attempt's process group; returns this rank's torch.device."""
    device = select_device(attempt.devices[rank])
    rendezvous(attempt, rank, device)
    return device


def rendezvous(attempt, rank: int, device):
    """Join the process group of ``attempt.generation`` through the attempt's TCPStore (rank 0 hosts it);
    returns the store (a regroup joins the next generation through it)."""
    host, port = attempt.host, attempt.port
    if port == 0 and rank != 0:  # rank 0 bound a port of its choice and wrote where (see AttemptSpec)
        host, port = attempt.published()
    store = elastic.tcp_store(host, port, attempt.world_size, attempt.timeout_s, is_master=rank == 0)
    if attempt.port == 0 and rank == 0:
        attempt.publish(f"{host}:{store.port}")
    elastic.join(store, attempt.generation_prefix(attempt.generation), rank, attempt.world_size, device,
                 attempt.timeout_s)
    if attempt.port == 0 and rank == 0:  # every rank has joined, so none reads it any more
        with contextlib.suppress(OSError):
            os.unlink(attempt.rendezvous_file)
    return store


def wrap_ddp(model, device, init_sync: bool = True):
    """DDP over the current process group; init_sync False when every rank holds the same weights already."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, init_sync=init_sync)


def broadcast_state(state, device, src: int = 0):
    """Rank src's ``state`` (what a checkpoint holds: dicts, lists, tensors, plain values) on every rank of
    the group; other ranks pass None and get it on ``device``, rank src gets its own state back.

    It travels as the bytes of ``torch.save`` in one uint8 tensor on ``device`` (NCCL works too), read
    with ``torch.load(weights_only=True)`` as a checkpoint is: no pickled object comes off the network."""
    import io

    import torch
    import torch.distributed as dist

    sender = dist.get_rank() == src
    payload = None
    if sender:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        payload = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8).to(device)
    size = torch.tensor([payload.numel() if sender else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src)
    if not sender:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=src)
    if sender:
        return state
    received = io.BytesIO(payload.cpu().numpy().tobytes())
    return torch.load(received, map_location=device, weights_only=True)


def snapshot(state):
    """A copy of ``state`` on the CPU that training no longer changes (for a checkpoint written in the background)."""
    import torch

    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: snapshot(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(snapshot(v) for v in state)
    return state


class _IdBatches:
    """A batch sampler that notes the sample ids it hands out (OMRU_SAMPLE_IDS=1)."""

    def __init__(self, batches):
        self.batches, self.ids = batches, []

    def __iter__(self):
        self.ids = []
        for batch in self.batches:
            self.ids.extend(batch)
            yield batch

    def __len__(self) -> int:
        return len(self.batches)


def train_step(ddp, optimizer, x, y, lr: float):
    """One SGD step at ``lr``; returns (summed loss, correct) of the local batch."""
    import torch.nn.functional as F

    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    out = ddp(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    optimizer.step()
    return float(loss.detach()) * len(y), int((out.detach().argmax(1) == y).sum())


# --- the worker ---------------------------------------------------------------------------


class _Job:
    """One rank of a zoo job: an `omru.elastic.Context` user, as a script would be."""

    def __init__(self, spec, attempt, rank: int, records: Records):
        import torch

        from omru import lsr
        from services.executor.worker import data, zoo

        self.spec, self.attempt, self.rank = spec, attempt, rank
        self.world = self.next_world = attempt.world_size
        self.generation = attempt.generation
        self.last_step_at = 0.0  # Unix time of this rank's last optimizer step
        self.resized: dict | None = None  # a resize whose pause rank 0 reports after the first step at the new size
        self.device = select_device(attempt.devices[rank])
        torch.manual_seed(spec.seed)
        self.splits = data.load(spec)  # (data and model before the rendezvous: a joiner keeps the others waiting less)
        model = zoo.build_model(spec.model, self.splits.num_classes, spec.image_size, spec.frames).to(self.device)
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=spec.base_lr, momentum=spec.momentum,
                                         weight_decay=spec.weight_decay)
        if self.generation:
            records.emit("joining", pid=os.getpid(), generation=self.generation)
        self.store = rendezvous(attempt, rank, self.device)
        self.ctx = elastic.Context(
            rank=rank, world_size=self.world, device=self.device, backend="gloo" if self.device.type == "cpu" else "nccl",
            checkpoint_dir=attempt.checkpoint_dir, epochs_total=spec.epochs, records=records,
            batch_size=spec.batch_size, job_id=spec.job_id, stop_file=attempt.stop_file, lease_file=attempt.lease_file, profile=attempt.profile,
            exit_after_profile=False, model_name=spec.model, fingerprint=spec.fingerprint())
        self.schedule = lsr.new_job(spec.base_lr, spec.base_batch, spec.batch_size, self.world, spec.warmup_epochs,
                                    spec.lr_decay, spec.epochs)
        if self.generation:
            self._share_state()
        elif attempt.profile is None:
            self._resume(lsr)
        self.ddp = wrap_ddp(model, self.device, init_sync=not self.generation)
        self.loader = self._train_loader()

    def _resume(self, lsr) -> None:
        import torch

        spec = self.spec
        state = self.ctx.load()
        if state is None:
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        if self.device.type == "cuda" and state["rng"].get("cuda"):
            torch.cuda.set_rng_state(state["rng"]["cuda"][0], self.device)
        self.schedule = lsr.resumed(lsr.LrSchedule.from_dict(state["lr_schedule"]), self.ctx.start_epoch,
                                    spec.base_lr, spec.base_batch, spec.batch_size, self.world)
        last = self.ctx.history[-1] if self.ctx.history else {}
        if last.get("world_size", self.world) != self.world and last.get("last_step_at"):
            self.resized = {"how": "restart", "from_size": last["world_size"], "since": last["last_step_at"]}

    def _share_state(self) -> None:
        """Rank 0's training state on every rank of a new group (a joiner takes it in; nothing from disk)."""
        from omru import lsr

        state = None
        if self.rank == 0:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "lr_schedule": self.schedule.to_dict(), "epoch": self.ctx.epoch, "history": self.ctx.history}
        state = broadcast_state(state, self.device)
        if self.generation != self.attempt.generation or self.rank == 0:
            return  # (a rank that was there already has it)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule = lsr.LrSchedule.from_dict(state["lr_schedule"])
        self.ctx.start_epoch = self.ctx.epoch = int(state["epoch"])
        self.ctx.history = list(state["history"])

    def _regroup(self, epoch: int, size: int) -> bool:
        """At the start of ``epoch``: go on with ``size`` ranks (see the module docstring); False when this rank
        leaves the job."""
        import torch.distributed as dist

        from omru import lsr

        t0, old = time.time(), self.world
        self.generation += 1
        if self.rank == 0:
            if self.attempt.port == 0 and size > old:  # joiners read the store's port where rank 0 publishes it
                self.attempt.publish(f"{self.attempt.host}:{self.store.port}")
            self.ctx.records.emit("regroup", epoch=epoch, from_size=old, to_size=size, generation=self.generation)
        self.ddp = None
        dist.destroy_process_group()
        if self.rank >= size:
            self.ctx.records.emit("left", epoch=epoch, generation=self.generation)
            return False
        elastic.join(self.store, self.attempt.generation_prefix(self.generation), self.rank, size, self.device,
                     self.attempt.timeout_s)
        if self.rank == 0 and self.attempt.port == 0 and size > old:
            with contextlib.suppress(OSError):
                os.unlink(self.attempt.rendezvous_file)
        spec = self.spec
        self.world = self.ctx.world_size = size
        self.schedule = lsr.resumed(self.schedule, epoch, spec.base_lr, spec.base_batch, spec.batch_size, size)
        if size > old:
            self._share_state()
        self.ddp = wrap_ddp(self.model, self.device, init_sync=False)
        self.loader = self._train_loader()
        self.resized = {"how": "in_place", "from_size": old, "since": self.last_step_at,
                        "regroup_s": time.time() - t0}
        return True

    def _train_loader(self):
        from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

        # drop_last: the sampler leaves out the few samples that do not divide by the world size, rather
        # than train some twice in the epoch
        self.sampler = DistributedSampler(self.splits.train, num_replicas=self.world, rank=self.rank,
                                          shuffle=True, seed=self.spec.seed, drop_last=True)
        # Drop a ragged last batch (BatchNorm cannot train on one sample) when there is a full one.
        drop_last = len(self.sampler) >= self.spec.batch_size
        if os.environ.get(SAMPLE_IDS_ENV) == "1":
            self.id_batches = _IdBatches(BatchSampler(self.sampler, self.spec.batch_size, drop_last))
            return DataLoader(self.splits.train, batch_sampler=self.id_batches, num_workers=0)
        self.id_batches = None
        return DataLoader(self.splits.train, batch_size=self.spec.batch_size, sampler=self.sampler,
                          drop_last=drop_last, num_workers=0)

    def _to_device(self, x, y):
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def evaluate(self) -> tuple[float, float]:
        """(test loss, test accuracy) over the whole held-out split, sharded over ranks."""
        import torch
        import torch.nn.functional as F
        from torch.utils.data import DataLoader, Subset

        shard = Subset(self.splits.test, list(range(self.rank, len(self.splits.test), self.world)))
        loss_sum = correct = 0.0
        self.model.eval()
        with torch.no_grad():
            for x, y in DataLoader(shard, batch_size=256):
                x, y = self._to_device(x, y)
                out = self.model(x)
                loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
                correct += int((out.argmax(1) == y).sum())
        self.model.train()
        loss_sum, correct = all_reduce([loss_sum, correct], self.device)
        n = len(self.splits.test)
        return loss_sum / n, correct / n

    def _state(self) -> dict:
        import torch

        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = [torch.cuda.get_rng_state(self.device)]
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "lr_schedule": self.schedule.to_dict(), "rng": rng}

    def train(self) -> bool:
        """Train the epochs left; False when this rank left the job (an in-place shrink)."""
        ctx, spec = self.ctx, self.spec
        for epoch in ctx.epochs():
            if self.next_world != self.world and not self._regroup(epoch, self.next_world):
                return False
            steps = len(self.loader)
            self.sampler.set_epoch(epoch)
            self.ddp.train()
            loss_sum = correct = seen = 0.0
            lr = self.schedule.lr(epoch)
            first_step_at = None
            for i, (x, y) in enumerate(ctx.batches(self.loader)):
                lr = self.schedule.lr(epoch + i / steps)
                l, c = train_step(self.ddp, self.optimizer, *self._to_device(x, y), lr)
                self.last_step_at = time.time()
                if first_step_at is None:
                    first_step_at = self.last_step_at
                    self._report_resize(epoch, lr)
                ctx.wait_saved(block=False)  # (an error of a background checkpoint write surfaces here)
                loss_sum, correct, seen = loss_sum + l, correct + c, seen + len(y)
            t1 = time.perf_counter()
            test_loss, accuracy = self.evaluate()
            eval_s = time.perf_counter() - t1
            loss_sum, correct, seen = all_reduce([loss_sum, correct, seen], self.device)
            (train_s,) = all_reduce([ctx.train_seconds], self.device, "max")
            ctx.report(epoch, epoch_seconds=train_s, eval_seconds=eval_s, loss=loss_sum / max(seen, 1),
                       train_accuracy=correct / max(seen, 1), test_loss=test_loss, accuracy=accuracy, lr=lr,
                       first_step_at=first_step_at, last_step_at=self.last_step_at)
            if self.id_batches is not None:
                ctx.records.emit("samples", epoch=epoch + 1, ids=list(self.id_batches.ids))
            self.next_world = self.attempt.size_after(epoch + 1, self.world) if epoch + 1 < spec.epochs else self.world
            in_place = self.next_world != self.world and self.attempt.in_place
            if self.next_world != self.world and not in_place:
                ctx.request_stop()  # the launcher restarts the job at the new size from this epoch's checkpoint
            # before a regroup, the checkpoint is written from a copy in the background
            ctx.save(snapshot(self._state()) if in_place and self.rank == 0 else self._state(), background=in_place)
        return True

    def _report_resize(self, epoch: int, lr: float) -> None:
        resized, self.resized = self.resized, None
        if resized is None or self.rank != 0:
            return
        self.ctx.records.emit("resized", epoch=epoch, from_size=resized["from_size"], to_size=self.world,
                              how=resized["how"], pause_s=self.last_step_at - resized["since"],
                              regroup_s=resized.get("regroup_s"), lr=lr)

    def profile(self) -> None:
        lr = self.schedule.lr(0)
        self.ddp.train()
        for x, y in self.ctx.batches(self.loader):
            train_step(self.ddp, self.optimizer, *self._to_device(x, y), lr)


def run(spec, attempt, rank: int, records: Records) -> None:
    import torch.distributed as dist

    job = _Job(spec, attempt, rank, records)
    ctx = job.ctx
    records.emit("started", pid=os.getpid(), world_size=job.world, backend=dist.get_backend(),
                 device=str(job.device), start_epoch=ctx.start_epoch, epochs=spec.epochs,
                 global_batch=ctx.global_batch, lr=job.schedule.lr(ctx.start_epoch), resumed_from=ctx.resumed_from,
                 generation=job.generation)
    try:
        if attempt.profile is not None:
            job.profile()
        elif not job.train():
            return  # left at a shrink (its process group is gone already)
        dist.barrier()
    except BaseException:
        if dist.is_initialized():
            dist.destroy_process_group()  # a peer may be gone: no exit handshake
        raise
    finally:
        ctx.wait_saved()
    elastic.leave(rank, job.world)


def _standby() -> list[str] | None:
    """``--standby`` (a warm worker, see warm.py): import what training needs,
    then read the arguments of the one run from stdin (a JSON list); None
    when stdin closes first (the pool let this worker go)."""
    import torch.distributed  # noqa: F401  (the seconds a cold worker spends before it can train)
    import torchvision  # noqa: F401

    from services.executor.worker import data  # noqa: F401

    with contextlib.suppress(ImportError):  # digits' loader (seconds: a joining rank keeps the others waiting)
        import sklearn.datasets  # noqa: F401

    import json

    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else None


def main(argv: list[str] | None = None) -> int:
    elastic.catch_stop_signal()  # before anything slow: a stop request must never kill us
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--standby"]:
        argv = _standby()
        if argv is None:
            return 0
    parser = argparse.ArgumentParser(prog="python -m services.executor.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--spec-json", required=True, help="spec.to_json(TrainSpec, AttemptSpec)")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--records", default="-", help="'-' = stdout (default) or a file to append to")
    args = parser.parse_args(argv)
    stream = _open_records(args.records)
    base = {"job_id": None, "attempt_id": None, "rank": args.rank}
    records = Records(stream, base)
    try:
        from services.executor.worker.spec import from_json

        spec, attempt = from_json(args.spec_json)
        base.update(job_id=spec.job_id, attempt_id=attempt.attempt_id)
        if not 0 <= args.rank < attempt.world_size:
            raise ValueError(f"rank {args.rank} is outside world_size {attempt.world_size}")
        run(spec, attempt, args.rank, records)
        return 0
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        records.emit("failed", message=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        stream.flush()
