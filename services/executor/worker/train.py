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

Record stream
-------------
The worker talks to its parent only through JSON lines, one object per line,
written to stdout (``--records -``, the default; anything else the process
prints goes to stderr) or appended to the file ``--records PATH``. Every record
has ``event``, ``job_id``, ``attempt_id``, ``rank`` and ``time`` (Unix
seconds). Only rank 0 writes ``epoch_done``, ``stopped``, ``finished`` and
``profile``; every rank writes ``started`` and, on an error, ``failed``.

``started``    pid, world_size, backend ("gloo"/"nccl"), device,
               start_epoch (epochs already done, from a checkpoint),
               epochs, global_batch, lr (the lr at start_epoch), resumed_from
               (checkpoint path or null)
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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import traceback

_stop_requested = False


def _on_sigusr1(_signum, _frame) -> None:
    global _stop_requested
    _stop_requested = True


class Records:
    """Writes one JSON record per line; flushed at once."""

    def __init__(self, stream, base: dict):
        self.stream, self.base = stream, base

    def emit(self, event: str, **fields) -> dict:
        record = {"event": event, **self.base, "time": time.time(), **fields}
        self.stream.write(json.dumps(record) + "\n")
        self.stream.flush()
        return record


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
    from datetime import timedelta

    import torch.distributed as dist

    device = select_device(attempt.devices[rank])
    timeout = timedelta(seconds=attempt.timeout_s)
    host, port = attempt.host, attempt.port
    if port == 0 and rank != 0:  # rank 0 bound a port of its choice and wrote where (see AttemptSpec)
        host, port = _published(attempt.rendezvous_file, attempt.timeout_s)
    store = dist.TCPStore(host, port, attempt.world_size, is_master=(rank == 0),
                          timeout=timeout, wait_for_workers=False)
    if attempt.port == 0 and rank == 0:
        _publish(attempt.rendezvous_file, f"{host}:{store.port}")
    prefixed = dist.PrefixStore(attempt.attempt_id, store)
    backend = "gloo" if device.type == "cpu" else "nccl"
    if backend == "gloo" and not os.environ.get("GLOO_SOCKET_IFNAME"):
        # gloo's own choice is the address the host name resolves to, often loopback: across
        # hosts each rank must offer the interface its peers reach it on
        interface = _interface_towards(host, port or store.port)
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=prefixed, rank=rank, world_size=attempt.world_size,
                            timeout=timeout, **kwargs)
    if attempt.port == 0 and rank == 0:  # every rank has joined, so none reads it any more
        with contextlib.suppress(OSError):
            os.unlink(attempt.rendezvous_file)
    global _STORE
    _STORE = prefixed
    return device


def _interface_towards(host: str, port: int) -> str:
    """Name of the local interface that packets to host leave by ("lo" for this machine itself; "" if none)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))  # (UDP: nothing is sent, the kernel only picks the route)
        local = s.getsockname()[0]
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):  # SIOCGIFADDR: the interface's IPv4 address
                if socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))[20:24]) == local:
                    return name
    return ""  # (then gloo chooses)


def _publish(path: str, endpoint: str) -> None:
    """Write endpoint to path at once as a whole (readers never see half of it)."""
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        f.write(endpoint)
    os.replace(partial, path)


def _published(path: str, timeout_s: float) -> tuple[str, int]:
    """The (host, port) rank 0 wrote to path; TimeoutError naming it after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(path) as f:
                host, _, port = f.read().strip().rpartition(":")
            return host, int(port)
        except (FileNotFoundError, ValueError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 did not publish its rendezvous in {path} within {timeout_s:.0f} s") from None
            time.sleep(0.05)


#: The attempt's store, kept for the exit handshake (see leave_distributed).
_STORE = None


def leave_distributed(rank: int, world_size: int, wait_s: float = 30.0) -> None:
    """Leave the process group so that rank 0, which hosts the TCPStore, exits last.

    If rank 0 exits while another rank is still tearing its process group
    down, that rank loses the store under its feet and aborts ("terminate
    called without an active exception"), which its executor would take for
    a crash. So every other rank checks out through the store after
    destroying its group, and rank 0 waits (bounded) for all of them."""
    import torch.distributed as dist

    dist.destroy_process_group()
    store = _STORE
    if store is None or world_size == 1:
        return
    if rank != 0:
        store.add("left", 1)
        return
    deadline = time.monotonic() + wait_s
    while store.add("left", 0) < world_size - 1 and time.monotonic() < deadline:
        time.sleep(0.05)


def wrap_ddp(model, device):
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def all_reduce(values: list[float], device, op: str = "sum") -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t.tolist()


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    def __init__(self, spec, attempt, rank: int, records: Records):
        import torch

        from services.executor.worker import checkpoint, data, lsr, zoo

        self.spec, self.attempt, self.rank, self.records = spec, attempt, rank, records
        self.world = attempt.world_size
        self.device = init_distributed(attempt, rank)
        torch.manual_seed(spec.seed)
        self.splits = data.load(spec)
        model = zoo.build_model(spec.model, self.splits.num_classes, spec.image_size, spec.frames).to(self.device)
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=spec.base_lr, momentum=spec.momentum,
                                         weight_decay=spec.weight_decay)
        self.schedule = lsr.new_job(spec.base_lr, spec.base_batch, spec.batch_size, self.world, spec.warmup_epochs,
                                    spec.lr_decay, spec.epochs)
        self.start_epoch, self.history, self.resumed_from = 0, [], None
        if attempt.profile is None:
            self._resume(checkpoint, lsr)
        self.ddp = wrap_ddp(model, self.device)
        self.loader = self._train_loader()
        self.global_batch = spec.batch_size * self.world

    def _resume(self, checkpoint, lsr) -> None:
        import torch

        spec = self.spec
        found = checkpoint.list_checkpoints(self.attempt.checkpoint_dir)
        epoch, path = found[-1] if found else (-1, None)
        lo, hi = all_reduce([epoch, -epoch], self.device, "max")
        if lo != -hi:
            raise RuntimeError(f"ranks see different newest checkpoints in {self.attempt.checkpoint_dir} "
                               f"(epochs {int(-hi)}..{int(lo)}); the folder must be shared by all ranks")
        if path is None:
            return
        state = checkpoint.load(path, spec.model, spec.fingerprint())
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        if self.device.type == "cuda" and state["rng"].get("cuda"):
            torch.cuda.set_rng_state(state["rng"]["cuda"][0], self.device)
        self.start_epoch = int(state["epoch"])
        self.history = list(state["history"])
        self.schedule = lsr.resumed(lsr.LrSchedule.from_dict(state["lr_schedule"]), self.start_epoch,
                                    spec.base_lr, spec.base_batch, spec.batch_size, self.world)
        self.resumed_from = path

    def _train_loader(self):
        from torch.utils.data import DataLoader, DistributedSampler

        self.sampler = DistributedSampler(self.splits.train, num_replicas=self.world, rank=self.rank,
                                          shuffle=True, seed=self.spec.seed)
        # Drop a ragged last batch (BatchNorm cannot train on one sample) when there is a full one.
        drop_last = len(self.sampler) >= self.spec.batch_size
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

    def _stop_wanted(self) -> bool:
        local = _stop_requested or bool(self.attempt.stop_file and os.path.exists(self.attempt.stop_file))
        return all_reduce([float(local)], self.device, "max")[0] > 0

    def _checkpoint(self, epoch: int) -> str:
        import torch

        from services.executor.worker import checkpoint

        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = [torch.cuda.get_rng_state(self.device)]
        return checkpoint.save(self.attempt.checkpoint_dir, {
            "job_id": self.spec.job_id,
            "model_name": self.spec.model,
            "fingerprint": self.spec.fingerprint(),
            "epoch": epoch,
            "world_size": self.world,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_schedule": self.schedule.to_dict(),
            "rng": rng,
            "history": self.history,
        })

    def train(self) -> None:
        spec, rec = self.spec, self.records
        steps = len(self.loader)
        began = time.time()
        for epoch in range(self.start_epoch, spec.epochs):
            self.sampler.set_epoch(epoch)
            self.ddp.train()
            loss_sum = correct = seen = 0.0
            lr = self.schedule.lr(epoch)
            _sync(self.device)
            t0 = time.perf_counter()
            for i, (x, y) in enumerate(self.loader):
                lr = self.schedule.lr(epoch + i / steps)
                l, c = train_step(self.ddp, self.optimizer, *self._to_device(x, y), lr)
                loss_sum, correct, seen = loss_sum + l, correct + c, seen + len(y)
            _sync(self.device)
            if self.attempt.lease_lapsed():  # before any collective: no rank of the attempt checkpoints
                raise SystemExit(f"node lease lapsed during epoch {epoch + 1}: stopped without a checkpoint")
            train_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            test_loss, accuracy = self.evaluate()
            eval_s = time.perf_counter() - t1
            loss_sum, correct, seen = all_reduce([loss_sum, correct, seen], self.device)
            (train_s,) = all_reduce([train_s], self.device, "max")
            record = {
                "epoch": epoch + 1, "epochs": spec.epochs, "epoch_seconds": train_s, "eval_seconds": eval_s,
                "loss": loss_sum / max(seen, 1), "train_accuracy": correct / max(seen, 1),
                "test_loss": test_loss, "accuracy": accuracy, "lr": lr, "world_size": self.world,
                "global_batch": self.global_batch, "steps": steps,
            }
            self.history.append(dict(record))
            if self.rank == 0:
                record["checkpoint"] = self._checkpoint(epoch + 1)
                rec.emit("epoch_done", **record)
            if epoch + 1 < spec.epochs and self._stop_wanted():
                if self.rank == 0:
                    rec.emit("stopped", epoch=epoch + 1)
                return
        if self.rank == 0:
            last = self.history[-1] if self.history else {}
            rec.emit("finished", epochs=spec.epochs, accuracy=last.get("accuracy"), test_loss=last.get("test_loss"),
                     loss=last.get("loss"), seconds=time.time() - began, history=self.history)

    def profile(self) -> None:
        prof = self.attempt.profile
        steps = len(self.loader)
        if steps == 0:
            raise RuntimeError(f"no full batch of {self.spec.batch_size} per rank in the training split; "
                               "raise train_samples or lower batch_size")

        def batches():
            epoch = 0
            while True:
                self.sampler.set_epoch(epoch)
                yield from self.loader
                epoch += 1

        it = batches()
        lr = self.schedule.lr(0)
        self.ddp.train()
        for _ in range(prof.warmup_iters):
            train_step(self.ddp, self.optimizer, *self._to_device(*next(it)), lr)
        _sync(self.device)
        if prof.mode == "sampled":
            times = []
            for _ in range(prof.measure_iters):
                t0 = time.perf_counter()  # loading the batch is part of an iteration, as in a full epoch
                x, y = self._to_device(*next(it))
                train_step(self.ddp, self.optimizer, x, y, lr)
                _sync(self.device)
                times.append(time.perf_counter() - t0)
            times.sort()
            iter_s, iters = times[len(times) // 2], len(times)
            (iter_s,) = all_reduce([iter_s], self.device, "max")
            epoch_s = iter_s * steps
        else:
            self.sampler.set_epoch(0)
            t0 = time.perf_counter()
            for x, y in self.loader:
                train_step(self.ddp, self.optimizer, *self._to_device(x, y), lr)
            _sync(self.device)
            (epoch_s,) = all_reduce([time.perf_counter() - t0], self.device, "max")
            iter_s, iters = epoch_s / steps, steps
        if self.rank == 0:
            self.records.emit("profile", mode=prof.mode, iter_seconds=iter_s, iters=iters,
                              warmup_iters=prof.warmup_iters, epoch_seconds=epoch_s, steps=steps,
                              world_size=self.world, global_batch=self.global_batch,
                              samples_per_second=self.global_batch / iter_s, device=str(self.device.type))


def run(spec, attempt, rank: int, records: Records) -> None:
    import torch.distributed as dist

    job = _Job(spec, attempt, rank, records)
    lr0 = job.schedule.lr(job.start_epoch)
    records.emit("started", pid=os.getpid(), world_size=job.world, backend=dist.get_backend(),
                 device=str(job.device), start_epoch=job.start_epoch, epochs=spec.epochs,
                 global_batch=job.global_batch, lr=lr0, resumed_from=job.resumed_from)
    try:
        if attempt.profile is not None:
            job.profile()
        else:
            job.train()
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()  # a peer may be gone: no exit handshake
        raise
    leave_distributed(rank, job.world)


def _standby() -> list[str] | None:
    """``--standby`` (a warm worker, see warm.py): import what training needs,
    then read the arguments of the one run from stdin (a JSON list); None
    when stdin closes first (the pool let this worker go)."""
    import torch.distributed  # noqa: F401  (the seconds a cold worker spends before it can train)
    import torchvision  # noqa: F401

    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else None


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGUSR1, _on_sigusr1)  # before anything slow: a stop request must never kill us
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
