"""omru.elastic: what a training script needs to run as an OMRU job (torch, no gRPC).

    from omru import elastic

    ctx = elastic.init()                               # process group from the environment
    model = Net().to(ctx.device)
    ddp = DistributedDataParallel(model, device_ids=ctx.device_ids)
    opt = torch.optim.SGD(model.parameters(), lr=ctx.scale_lr(base_lr=0.1, base_batch=256))
    state = ctx.load()                                 # the newest checkpoint (None on a fresh start)
    if state:
        model.load_state_dict(state["model"]); opt.load_state_dict(state["optimizer"])
    for epoch in ctx.epochs():                         # the epochs still to run (0-based, like range)
        sampler.set_epoch(epoch)
        for x, y in ctx.batches(loader):               # timed in a profiling trial
            ...
        ctx.report(epoch, loss=loss, accuracy=acc)     # what `omru watch` shows
        ctx.save({"model": model.state_dict(), "optimizer": opt.state_dict()})

`init()` joins the job's process group (NCCL on a GPU, gloo on a CPU slot)
from the environment the executor sets, torchrun's names where they exist:
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
CUDA_VISIBLE_DEVICES (a rank's GPU is ``cuda:LOCAL_RANK``), and
OMRU_JOB_ID, OMRU_ATTEMPT_ID, OMRU_CHECKPOINT_DIR, OMRU_EPOCHS,
OMRU_BATCH_SIZE (per rank), OMRU_BASE_LR, OMRU_BASE_BATCH,
OMRU_WARMUP_EPOCHS, OMRU_SEED, OMRU_STOP_FILE, OMRU_LEASE_FILE and, in a profiling trial,
OMRU_PROFILE. Without them (``python train.py`` on a laptop) it runs one rank
on this machine, checkpoints to ./checkpoints and trains ``init(epochs=...)``.

`epochs()` ends early, after the current epoch, when the executor asks the
job to stop or move to other GPUs (the stop file exists or SIGUSR1 came, on
any rank): the next attempt resumes from the checkpoint `save` wrote, on
whatever number of GPUs, and `scale_lr` then gives the lr of the new global
batch. `save` is atomic, written by rank 0 into the job's checkpoint folder,
which every rank reads (`load`). A profiling trial (OMRU_PROFILE) saves
nothing, so there a stop request ends the process at once (SIGUSR1 keeps its
default action): the profiler bounds every trial in time and stops the ones
that overrun.

The library needs torch and the omru package only (checkpoints: omru.checkpoint,
the linear scaling rule: omru.lsr, the trial's ProfileSpec: omru.spec), not
gRPC and not ``services``.

Records: the library talks to the executor through lines of its stdout that
start with `RECORD_PREFIX` and hold one JSON object (the zoo worker,
services/executor/worker/train.py, emits the same through `Records`).
Every record has ``event``, ``job_id``, ``attempt_id``, ``rank``, ``time``;
the events and their fields are listed in train.py.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

from omru import checkpoint, lease, lsr
from omru.spec import ProfileSpec

#: Start of a record line on a worker's stdout.
RECORD_PREFIX = "@omru-record "
#: model_name of the checkpoints a script writes (the zoo worker writes its model's name).
SCRIPT_MODEL = "script"

_stop_signalled = False


def _on_sigusr1(_signum, _frame) -> None:
    global _stop_signalled
    _stop_signalled = True


def catch_stop_signal() -> None:
    """From now on SIGUSR1 asks for a stop at the next epoch boundary (instead of killing the process)."""
    signal.signal(signal.SIGUSR1, _on_sigusr1)


def stop_at_once(stop_file: str) -> None:
    """For a profiling trial, which has nothing to save: from now on SIGUSR1 ends the process at once (its
    default action, even inside a blocking call), and a stop asked for already ends it now."""
    with contextlib.suppress(ValueError):  # (not the main thread: signals stay as they are)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    if stop_requested(stop_file):
        os.kill(os.getpid(), signal.SIGUSR1)


def stop_requested(stop_file: str) -> bool:
    """True once SIGUSR1 came or the stop file exists (this process's view only)."""
    return _stop_signalled or bool(stop_file and os.path.exists(stop_file))


class Records:
    """Writes one record per line (`RECORD_PREFIX` + JSON), flushed at once (from any thread)."""

    def __init__(self, stream, base: dict):
        self.stream, self.base = stream, base
        self._lock = threading.Lock()

    def emit(self, event: str, **fields) -> dict:
        record = {"event": event, **self.base, "time": time.time(), **fields}
        with self._lock:
            self.stream.write(RECORD_PREFIX + json.dumps(record) + "\n")
            self.stream.flush()
        return record


def parse_record(line: str) -> tuple[str, dict | None]:
    """Split a stdout line into (what the program printed, the record it carries or None)."""
    at = line.find(RECORD_PREFIX)
    if at < 0:
        return line, None
    try:
        record = json.loads(line[at + len(RECORD_PREFIX):])
    except json.JSONDecodeError:
        return line, None
    return line[:at], record if isinstance(record, dict) else None


# --- collectives and the process group -------------------------------------------------


def all_reduce(values: list[float], device, op: str = "sum") -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t.tolist()


def sync(device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tcp_store(host: str, port: int, world_size: int | None, timeout_s: float, is_master: bool):
    """A c10d TCPStore at host:port: its server (port 0: a port of the OS's choice) or a client of it."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(host, port, world_size, is_master=is_master, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


#: The attempt's store, kept for the exit handshake (see leave).
_STORE = None


def join(store, prefix: str, rank: int, world_size: int, device, timeout_s: float, hosted: bool = True) -> str:
    """Join the process group through store under prefix (NCCL on a GPU, gloo on CPU); returns the backend.
    hosted: rank 0 hosts the store (then it waits for the others before it exits, see `leave`)."""
    from datetime import timedelta

    import torch.distributed as dist

    global _STORE
    prefixed = dist.PrefixStore(prefix, store)
    backend = "gloo" if device.type == "cpu" else "nccl"
    if backend == "gloo" and not os.environ.get("GLOO_SOCKET_IFNAME"):
        # gloo's own choice is the address the host name resolves to, often loopback: across
        # hosts each rank must offer the interface its peers reach it on
        interface = _interface_towards(store.host, store.port)
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s), **kwargs)
    _STORE = prefixed if hosted else None
    return backend


def _interface_towards(host: str, port: int) -> str:
    """Name of the local interface that packets to host leave by ("lo" for this machine itself; "" if none)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))  # (UDP: nothing is sent, the kernel only picks the route)
        except OSError:
            return ""
        local = s.getsockname()[0]
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):  # SIOCGIFADDR: the interface's IPv4 address
                if socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))[20:24]) == local:
                    return name
    return ""  # (then gloo chooses)


def leave(rank: int, world_size: int, wait_s: float = 30.0) -> None:
    """Leave the process group so that rank 0, which hosts the TCPStore, exits last.

    If rank 0 exits while another rank is still tearing its process group
    down, that rank loses the store under its feet and aborts ("terminate
    called without an active exception"), which its executor would take for
    a crash. So every other rank checks out through the store after
    destroying its group, and rank 0 waits (bounded) for all of them."""
    global _STORE
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    store, _STORE = _STORE, None
    if store is None or world_size == 1:
        return
    with contextlib.suppress(Exception):  # a peer already gone: nothing to wait for
        if rank != 0:
            store.add("left", 1)
            return
        deadline = time.monotonic() + wait_s
        while store.add("left", 0) < world_size - 1 and time.monotonic() < deadline:
            time.sleep(0.05)


def newest_checkpoint(checkpoint_dir: str, device) -> tuple[int, str | None]:
    """(epoch, path) of the newest checkpoint in the folder, the same on every rank ((0, None): none).

    RuntimeError when the ranks see different ones (the folder is not shared)."""
    found = checkpoint.list_checkpoints(checkpoint_dir)
    epoch, path = found[-1] if found else (0, None)
    lo, hi = all_reduce([epoch, -epoch], device, "max")
    if lo != -hi:
        raise RuntimeError(f"ranks see different newest checkpoints in {checkpoint_dir} "
                           f"(epochs {int(-hi)}..{int(lo)}); the folder must be shared by all ranks")
    return epoch, path


# --- the context of one rank -----------------------------------------------------------


@dataclass
class Context:
    """One rank of a job; see the module docstring.

    ``batch_size`` is the per-rank batch of the job spec (None outside
    OMRU unless given to `init`); ``epoch`` the epoch in progress;
    ``start_epoch`` the epoch `load` resumes at; ``stopped`` is True when
    `epochs` ended early on a stop request. ``model_name`` and
    ``fingerprint`` are what checkpoints are stamped with and checked
    against (the zoo worker sets its model's)."""

    rank: int
    world_size: int
    device: object
    backend: str
    checkpoint_dir: str
    epochs_total: int
    records: Records
    local_rank: int = 0
    batch_size: int | None = None
    job_id: str = ""
    stop_file: str = ""
    lease_file: str = ""
    profile: ProfileSpec | None = None
    exit_after_profile: bool = True
    model_name: str = SCRIPT_MODEL
    fingerprint: str | None = None
    start_epoch: int = 0
    epoch: int = 0
    lr: float = 0.0
    stopped: bool = False
    history: list[dict] = field(default_factory=list)
    steps: int = 0
    _pending: dict | None = None
    resumed_from: str | None = None
    train_seconds: float | None = None  # the epoch's time in `batches` (None before it ended)
    _saved_epoch: int = -1
    _epoch_t0: float = 0.0
    _stop_asked: bool = False
    _writer: threading.Thread | None = None  # rank 0's checkpoint write in the background (save(background=True))
    _write_error: BaseException | None = None
    _sigterm: object = None  # SIGTERM's handler while a background write runs
    _began: float = field(default_factory=time.time)

    @property
    def device_ids(self) -> list[int] | None:
        """What DistributedDataParallel's device_ids wants for this rank."""
        return [self.device.index] if self.device.type == "cuda" else None

    @property
    def global_batch(self) -> int:
        return (self.batch_size or 0) * self.world_size

    def scale_lr(self, base_lr: float, base_batch: int, batch_size: int | None = None, warmup_epochs: float = 0.0,
                 epoch: float | None = None) -> float:
        """The linear scaling rule: base_lr x global batch / base_batch.

        The global batch is the per-rank batch_size (default: the job's) x
        world_size. With warmup_epochs, the lr ramps linearly from base_lr
        over the job's first warmup_epochs epochs (at `epoch`, default the one
        in progress)."""
        batch = batch_size or self.batch_size
        if not batch:
            raise ValueError("batch_size: not set (OMRU_BATCH_SIZE); pass the per-rank batch size")
        schedule = lsr.new_job(base_lr, base_batch, batch, self.world_size, warmup_epochs)
        self.lr = schedule.lr(self.epoch if epoch is None else epoch)
        return self.lr

    def lease_lapsed(self) -> bool:
        """True when the node's lease may have lapsed (OMRU_LEASE_FILE holds until when it holds): the
        planner may then run the job elsewhere, so this attempt must neither checkpoint nor report."""
        return lease.lapsed(self.lease_file)

    def _fence(self) -> None:
        if self.lease_lapsed():  # before the epoch's collectives: no rank of the attempt checkpoints
            raise SystemExit(f"node lease lapsed during epoch {self.epoch + 1}: stopped without a checkpoint")

    def load(self) -> dict | None:
        """The newest checkpoint's state (what `save` was given, plus epoch, history, ...), None if there is
        none; training resumes at its epoch (`start_epoch`)."""
        _, path = newest_checkpoint(self.checkpoint_dir, self.device)
        if path is None:
            return None
        state = checkpoint.load(path, self.model_name, self.fingerprint)
        self.start_epoch = self.epoch = int(state["epoch"])
        self.history = list(state.get("history") or [])
        self.resumed_from = path
        return state

    def save(self, state: dict, background: bool = False) -> str | None:
        """Checkpoint the epoch in progress as done (rank 0 writes it atomically); returns the path on rank 0.

        background: rank 0 writes it in a thread and returns None at once (``state`` must then be a copy
        that nothing changes any more); the epoch's record is sent once the file is in place. Until
        then SIGTERM waits for the write (the process ends right after it), so a stop never costs the
        epoch; `wait_saved` waits for it."""
        self._fence()
        self.wait_saved()
        self._saved_epoch = self.epoch + 1
        path = None
        if self.rank == 0:
            state = {**state, "job_id": self.job_id, "model_name": self.model_name,
                     "fingerprint": self.fingerprint or "", "epoch": self.epoch + 1, "world_size": self.world_size,
                     "history": list(self.history)}
            if background:
                record, self._pending = self._pending, None
                self._write_in_background(state, record)
                return None
            path = checkpoint.save(self.checkpoint_dir, state)
        if self._pending is not None:
            self._pending["checkpoint"] = path
            self._emit_pending()
        return path

    def _write_in_background(self, state: dict, record: dict | None) -> None:
        def write() -> None:
            try:
                path = checkpoint.save(self.checkpoint_dir, state)
            except BaseException as exc:  # (raised in the main thread by wait_saved)
                self._write_error = exc
                return
            if record is not None:
                self.records.emit("epoch_done", **{**record, "checkpoint": path})

        def on_sigterm(signum, _frame) -> None:
            self.wait_saved()
            os._exit(128 + signum)

        with contextlib.suppress(ValueError):  # (not the main thread: SIGTERM stays as it is)
            self._sigterm = signal.signal(signal.SIGTERM, on_sigterm)
        self._writer = threading.Thread(target=write, name="omru-checkpoint")
        self._writer.start()

    def wait_saved(self, block: bool = True) -> bool:
        """Wait for a background checkpoint write (block False: only see whether it ended); True when
        none is running. Raises what the write raised."""
        writer = self._writer
        if writer is not None:
            if block:
                writer.join()
            elif writer.is_alive():
                return False
            self._writer = None
            if self._sigterm is not None:
                with contextlib.suppress(ValueError):
                    signal.signal(signal.SIGTERM, self._sigterm)
                self._sigterm = None
        error, self._write_error = self._write_error, None
        if error is not None:
            raise error
        return True

    def report(self, epoch: int, **metrics) -> None:
        """Report the epoch's figures (loss, accuracy, lr, anything else; rank 0's are kept).

        Sent once the epoch is checkpointed (or at its end when it is not), so
        a reported epoch is never trained again."""
        record = {"epoch": epoch + 1, "epochs": self.epochs_total, "loss": 0.0, "accuracy": 0.0, "lr": self.lr,
                  "epoch_seconds": self.train_seconds if self.train_seconds is not None else time.perf_counter() - self._epoch_t0,
                  "world_size": self.world_size, "global_batch": self.global_batch, "steps": self.steps}
        record.update({k: float(v) if hasattr(v, "item") else v for k, v in metrics.items()})
        self.history.append(dict(record))
        self._pending = record
        if self._saved_epoch == epoch + 1:
            self._emit_pending()

    def _emit_pending(self) -> None:
        record, self._pending = self._pending, None
        if record is not None and self.rank == 0:
            self.records.emit("epoch_done", **record)

    def request_stop(self) -> None:
        """Stop at the end of the epoch in progress, as on a stop request from the executor."""
        self._stop_asked = True

    def stop_wanted(self) -> bool:
        """True on every rank when any rank was asked to stop (a collective: call it on all ranks)."""
        asked = self._stop_asked or stop_requested(self.stop_file)
        return all_reduce([float(asked)], self.device, "max")[0] > 0

    def epochs(self):
        """The epochs still to run; ends early after an epoch when a stop was asked for (``stopped``)."""
        for epoch in range(self.start_epoch, self.epochs_total):
            self.epoch, self.train_seconds, self._epoch_t0 = epoch, None, time.perf_counter()
            yield epoch
            self._emit_pending()
            if epoch + 1 < self.epochs_total and self.stop_wanted():
                self.wait_saved()
                if self._saved_epoch != epoch + 1:
                    print(f"omru.elastic: stopping after epoch {epoch + 1}, which was not saved "
                          "(ctx.save): the next attempt trains it again", file=sys.stderr)
                if self.rank == 0:
                    self.records.emit("stopped", epoch=epoch + 1)
                self.stopped = True
                return
        self.wait_saved()
        if self.rank == 0:
            last = self.history[-1] if self.history else {}
            self.records.emit("finished", epochs=self.epochs_total, accuracy=last.get("accuracy"),
                              test_loss=last.get("test_loss"), loss=last.get("loss"),
                              seconds=time.time() - self._began, history=self.history)

    def batches(self, loader):
        """The loader's batches, training time measured; in a profiling trial, timed iterations instead.

        A trial runs the profile's warm-up iterations, then times
        measure_iters iterations (fetching the batch and what the loop body
        does with it) or one full epoch, reports PROFILED (the slowest
        rank's median) and ends the process at once (exit 0, no teardown), or, with
        ``exit_after_profile`` False, the iteration."""
        self.steps = len(loader)
        if self.profile is None:
            sync(self.device)
            t0 = time.perf_counter()
            yield from loader
            sync(self.device)
            self.train_seconds = time.perf_counter() - t0
            self._fence()
            return
        yield from self._trial(loader)
        if self.exit_after_profile:
            leave(self.rank, self.world_size)
            # Exit now, not through the interpreter's teardown: the script's frames still hold its model
            # (DDP and the process group it keeps alive), and freeing those at finalization can abort
            # the process (SIGABRT, "terminate called without an active exception") after a good trial.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def _trial(self, loader):
        stop_at_once(self.stop_file)
        prof, steps = self.profile, len(loader)
        if steps == 0:
            raise RuntimeError(f"the loader has no batch (batch size {self.batch_size} per rank); "
                               "give it more samples or a smaller batch")

        def endless():
            epoch = 0
            while True:
                if hasattr(getattr(loader, "sampler", None), "set_epoch"):
                    loader.sampler.set_epoch(epoch)
                yield from loader
                epoch += 1

        it = endless()
        for _ in range(prof.warmup_iters):
            yield next(it)
        sync(self.device)
        if prof.mode == "sampled":
            times = []
            for _ in range(prof.measure_iters):
                t0 = time.perf_counter()  # loading the batch is part of an iteration, as in a full epoch
                yield next(it)
                sync(self.device)
                times.append(time.perf_counter() - t0)
            (iter_s,) = all_reduce([statistics.median_high(times)], self.device, "max")
            iters, epoch_s = len(times), iter_s * steps
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                yield next(it)
            sync(self.device)
            (epoch_s,) = all_reduce([time.perf_counter() - t0], self.device, "max")
            iter_s, iters = epoch_s / steps, steps
        if self.rank == 0:
            self.records.emit("profile", mode=prof.mode, iter_seconds=iter_s, iters=iters,
                              warmup_iters=prof.warmup_iters, epoch_seconds=epoch_s, steps=steps,
                              world_size=self.world_size, global_batch=self.global_batch,
                              samples_per_second=self.global_batch / iter_s, device=str(self.device.type))

    def close(self) -> None:
        """Leave the process group (rank 0 last); called at exit."""
        with contextlib.suppress(Exception):
            self.wait_saved()
        leave(self.rank, self.world_size)


def _device(local_rank: int):
    import torch

    if os.environ.get("CUDA_VISIBLE_DEVICES", "") != "" and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init(epochs: int | None = None, batch_size: int | None = None, timeout_s: float | None = None) -> Context:
    """Join the job's process group (see the module docstring); epochs and batch_size are used only where
    the environment does not set them (a run outside OMRU)."""
    env = os.environ
    profile = ProfileSpec(**json.loads(env["OMRU_PROFILE"])) if env.get("OMRU_PROFILE") else None
    if profile is None:
        catch_stop_signal()
    else:
        stop_at_once(env.get("OMRU_STOP_FILE", ""))
    rank, world = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
    local_rank = int(env.get("LOCAL_RANK", rank))
    timeout_s = float(env.get("OMRU_TIMEOUT_S", timeout_s or 300.0))
    host = env.get("MASTER_ADDR", "127.0.0.1")
    port = int(env.get("MASTER_PORT", 0))  # (0 on one rank outside OMRU: the OS picks one)
    device = _device(local_rank)
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # the executor hosts the store
    store = tcp_store(host, port, world, timeout_s, is_master=rank == 0 and not agent)
    attempt_id = env.get("OMRU_ATTEMPT_ID", "local")
    backend = join(store, attempt_id, rank, world, device, timeout_s, hosted=not agent)
    # records go to the real stdout whatever the script does with sys.stdout (nowhere outside OMRU)
    stream = os.fdopen(os.dup(1), "w", buffering=1) if "OMRU_JOB_ID" in env else open(os.devnull, "w")
    records = Records(stream, {"job_id": env.get("OMRU_JOB_ID", "local"), "attempt_id": attempt_id, "rank": rank})
    total = int(env.get("OMRU_EPOCHS") or epochs or 1)
    batch = int(env.get("OMRU_BATCH_SIZE") or batch_size or 0) or None
    ctx = Context(rank=rank, world_size=world, device=device, backend=backend, local_rank=local_rank,
                  checkpoint_dir=env.get("OMRU_CHECKPOINT_DIR") or os.path.abspath("checkpoints"),
                  epochs_total=total, records=records, batch_size=batch, job_id=env.get("OMRU_JOB_ID", ""),
                  stop_file=env.get("OMRU_STOP_FILE", ""), lease_file=env.get("OMRU_LEASE_FILE", ""),
                  profile=profile)
    atexit.register(ctx.close)
    found = checkpoint.list_checkpoints(ctx.checkpoint_dir)
    sys.stdout.flush()
    records.emit("started", pid=os.getpid(), world_size=world, backend=backend, device=str(device),
                 start_epoch=found[-1][0] if found else 0, epochs=total, global_batch=ctx.global_batch)
    return ctx


__all__ = ["Context", "init", "Records", "RECORD_PREFIX", "parse_record"]
