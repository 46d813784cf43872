"""Start the local worker processes of one attempt and supervise them.

`WorkerGroup` starts one process per local rank (all ranks, or the subset
``ranks`` this node hosts when a job spans nodes): for a zoo job ``python -m
services.executor.worker`` (handed out by a `warm.WarmPool` when it has one:
torch already imported) with ``CUDA_VISIBLE_DEVICES`` set to the rank's GPU,
or ``OMP_NUM_THREADS=1`` on a CPU slot; for a script job its ``command`` in
its ``workdir`` with the environment `script_env` gives (torchrun's variables
and OMRU_*). It parses the records in each process's stdout (schema:
`services.executor.worker.train`, prefix `omru.elastic.RECORD_PREFIX`) and
hands every record to ``on_record`` (a plain function or a coroutine
function), writes what each rank prints (stdout and stderr) to
``log_dir/rank-<rank>.log``, keeps the tail of each rank's stderr, and
notices a dead worker: when any rank exits non-zero, the others are stopped
(SIGTERM, then SIGKILL after ``grace_s``) and the attempt's outcome is
``failed``, with a message naming the rank, its exit code and the last lines
of its stderr (or the error it reported).

`request_stop()` asks the job to stop at the next epoch boundary (it creates
the attempt's stop file and sends SIGUSR1 to ranks that have started, which
checkpoint, report ``stopped`` and exit 0). Ranks that never said they
started (a script that does not use omru.elastic, which cannot stop at an
epoch boundary) are terminated instead; the next attempt resumes from
whatever checkpoint the script wrote.

A zoo job that resizes in place (``attempt.resizes``, see train.py) tells
its launcher with a ``regroup`` record from rank 0: when the group grows and
all its ranks are local, the launcher starts the joining ranks at once (from
the warm pool when there is one); they are supervised like the others. A
shrink ends the leaving ranks by themselves (exit 0).

Built on asyncio (the executor servicer is grpc.aio); `run_attempt` is the
synchronous wrapper for `omru train` and scripts, and `run_local` runs a job
with planned resizes on this machine, in place or by restarts, falling back to
a restart from the checkpoint when an in-place regroup fails.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import inspect
import json
import os
import re
import shutil
import signal
import socket
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from omru.checkpoint import list_checkpoints
from omru.elastic import parse_record
from omru.spec import ProfileSpec
from services.executor.worker.spec import AttemptSpec, TrainSpec, to_json
from services.executor.worker.warm import LINE_LIMIT, WarmPool, hand_arguments, start_standby

#: Lines of the failing rank's stderr a failure message carries.
FAILURE_LINES = 4
#: Characters kept of each of those lines.
FAILURE_LINE_CHARS = 300
#: What torch puts before each line a rank prints after joining its process group ("[rank0]: ").
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for rank 0's TCPStore)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker_env(base: dict[str, str], device: str) -> dict[str, str]:
    """The environment of a worker on `device` ("cpu" = one thread, no GPU; else a GPU index)."""
    env = dict(base)
    if device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["CUDA_VISIBLE_DEVICES"] = device
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def script_argv(spec: TrainSpec, python: str = sys.executable) -> list[str]:
    """A script job's command; "python" as its first word is this interpreter (torch and omru installed).

    Run under ``setpriv --pdeathsig KILL`` where util-linux has it, so that a
    script dies with its executor, as the zoo worker does (worker/__main__.py)."""
    argv = [python if i == 0 and word == "python" else word for i, word in enumerate(spec.command)]
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


def script_env(base: dict[str, str], spec: TrainSpec, attempt: AttemptSpec, rank: int, local: Sequence[int],
               master: tuple[str, int]) -> dict[str, str]:
    """The environment of one rank of a script job: torchrun's variables, OMRU_* (see omru.elastic), the job's env.

    On GPUs CUDA_VISIBLE_DEVICES lists the node's GPUs of the attempt in local
    rank order, so a rank's GPU is cuda:LOCAL_RANK (as under torchrun)."""
    device = attempt.devices[rank]
    env = worker_env({**base, **dict(spec.env)}, device)
    if device != "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(attempt.devices[r] for r in local)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(list(local).index(rank)), "WORLD_SIZE": str(attempt.world_size),
        "LOCAL_WORLD_SIZE": str(len(local)), "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # the executor hosts the store (see WorkerGroup._rendezvous)
        "OMRU_JOB_ID": spec.job_id, "OMRU_ATTEMPT_ID": attempt.attempt_id, "OMRU_CHECKPOINT_DIR": attempt.checkpoint_dir,
        "OMRU_EPOCHS": str(spec.epochs), "OMRU_BATCH_SIZE": str(spec.batch_size), "OMRU_BASE_LR": repr(spec.base_lr),
        "OMRU_BASE_BATCH": str(spec.base_batch), "OMRU_WARMUP_EPOCHS": repr(spec.warmup_epochs),
        "OMRU_SEED": str(spec.seed), "OMRU_STOP_FILE": attempt.stop_file, "OMRU_LEASE_FILE": attempt.lease_file,
        "OMRU_TIMEOUT_S": repr(attempt.timeout_s),
    })
    if attempt.profile is not None:
        env["OMRU_PROFILE"] = json.dumps(dataclasses.asdict(attempt.profile))
    return env


def new_attempt(world_size: int, checkpoint_dir: str, devices: Sequence[str] = (), host: str = "127.0.0.1",
                profile: ProfileSpec | None = None, attempt_id: str | None = None,
                timeout_s: float = 300.0, resizes: Sequence[tuple[int, int]] = (),
                in_place: bool = True) -> AttemptSpec:
    """An attempt on this machine: fresh id (store prefix), free port, per-attempt stop file (devices: one per
    rank of the largest size, see AttemptSpec)."""
    attempt_id = attempt_id or f"a-{uuid.uuid4().hex[:12]}"
    return AttemptSpec(
        attempt_id=attempt_id,
        world_size=world_size,
        rendezvous=f"{host}:{free_port(host)}",
        checkpoint_dir=checkpoint_dir,
        devices=tuple(devices),
        stop_file=os.path.join(checkpoint_dir, f".stop-{attempt_id}"),
        profile=profile,
        timeout_s=timeout_s,
        resizes=tuple(resizes),
        in_place=in_place,
    )


@dataclass
class LaunchResult:
    """How an attempt ended.

    outcome: ``finished`` (all epochs done), ``stopped`` (at an epoch boundary,
    on request), ``profiled`` (rank 0 reported the slowest rank's timing: a rank
    dying after that, in its teardown, does not fail the trial), ``exited`` (all local ranks exited 0 without a
    final record: ranks > 0 on a node that does not host rank 0), ``terminated``
    (`WorkerGroup.terminate` was called), ``failed`` (a rank exited non-zero).
    """

    outcome: str
    records: list[dict] = field(default_factory=list)
    returncodes: dict[int, int] = field(default_factory=dict)
    message: str = ""  # failed: the rank, its exit code, the last lines of its stderr (or its reported error)

    def of(self, event: str) -> list[dict]:
        return [r for r in self.records if r.get("event") == event]

    @property
    def epochs(self) -> list[dict]:
        return self.of("epoch_done")

    @property
    def final(self) -> dict | None:
        found = self.of("finished") or self.of("profile") or self.of("stopped")
        return found[-1] if found else None


class WorkerGroup:
    """The local worker processes of one attempt."""

    def __init__(self, spec: TrainSpec, attempt: AttemptSpec, ranks: Sequence[int] | None = None,
                 on_record: Callable[[dict], object] | None = None, python: str = sys.executable,
                 env: dict[str, str] | None = None, stderr_lines: int = 40, grace_s: float = 5.0,
                 stderr_to=None, pool: WarmPool | None = None, log_dir: str | os.PathLike | None = None):
        self.spec, self.attempt = spec, attempt
        self.ranks = list(range(attempt.world_size)) if ranks is None else list(ranks)
        bad = [r for r in self.ranks if not 0 <= r < attempt.world_size]
        if bad or len(set(self.ranks)) != len(self.ranks) or not self.ranks:
            raise ValueError(f"ranks {self.ranks} must be distinct and in 0..{attempt.world_size - 1}")
        self.on_record, self.python, self.grace_s = on_record, python, grace_s
        self.base_env = dict(os.environ if env is None else env)
        self.stderr_to = stderr_to
        self.pool = pool  # warm workers to start from (else each rank starts cold)
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.records: list[dict] = []
        self.stderr_tail = collections.defaultdict(lambda: collections.deque(maxlen=stderr_lines))
        self._all_local = set(self.ranks) == set(range(attempt.world_size))  # (then it starts joining ranks)
        self._joined: asyncio.Event | None = None
        self._logs: dict[int, object] = {}
        self._started: set[int] = set()
        self._stopping = False
        self._published = False
        self._store = None  # a script job's TCPStore, on the node of rank 0
        self.master: tuple[str, int] | None = None  # a script job's MASTER_ADDR, MASTER_PORT
        self._tasks: set[asyncio.Task] = set()

    @property
    def pids(self) -> dict[int, int]:
        return {r: p.pid for r, p in self.procs.items()}

    async def start(self) -> None:
        if self.attempt.stop_file and os.path.exists(self.attempt.stop_file):
            os.unlink(self.attempt.stop_file)
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.spec.is_script:
            self._open_logs(self.ranks)
            await self._start_script()
            return
        for rank in self.ranks:
            await self._spawn(rank, self.attempt)

    def _open_logs(self, ranks: Sequence[int]) -> None:
        if self.log_dir is not None:
            for r in ranks:
                if r not in self._logs:
                    self._logs[r] = open(self.log_dir / f"rank-{r}.log", "a", buffering=1, errors="replace")

    async def _spawn(self, rank: int, attempt: AttemptSpec) -> None:
        """Start one zoo worker of ``attempt`` (a joining rank: its generation and size)."""
        self._open_logs([rank])
        args = ["--spec-json", to_json(self.spec, attempt), "--rank", str(rank)]
        env = worker_env(self.base_env, attempt.devices[rank])
        if self.pool is not None:
            self.procs[rank] = await self.pool.spawn(args, env)
        else:
            self.procs[rank] = proc = await start_standby(self.python, env)
            await hand_arguments(proc, args)

    async def _start_joiners(self, record: dict) -> None:
        """A ``regroup`` record that grows the job: start its joining ranks (supervised from then on by `wait`)."""
        size, old = record["to_size"], record["from_size"]
        if size <= old or not self._all_local or self._stopping:
            return
        joining = dataclasses.replace(self.attempt, world_size=size, generation=record["generation"])
        for rank in range(old, size):
            await self._spawn(rank, joining)
        if self._joined is not None:
            self._joined.set()

    async def _start_script(self) -> None:
        self.master = master = await self._rendezvous()
        argv = script_argv(self.spec, self.python)
        for rank in self.ranks:
            env = script_env(self.base_env, self.spec, self.attempt, rank, self.ranks, master)
            self.procs[rank] = await asyncio.create_subprocess_exec(
                *argv, cwd=self.spec.workdir or None, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=LINE_LIMIT,
                start_new_session=True)  # (its own process group: a stop reaches the script's children too)

    async def _rendezvous(self) -> tuple[str, int]:
        """MASTER_ADDR and MASTER_PORT of a script job. The node of rank 0 hosts the attempt's TCPStore
        itself (as torchrun's agent does, TORCHELASTIC_USE_AGENT_STORE), so no rank's exit can take it from
        the others; at port 0 it publishes the port it got in the checkpoint folder, where the other nodes
        wait for it."""
        from omru.elastic import tcp_store

        host, port = self.attempt.host, self.attempt.port
        if 0 in self.ranks:
            self._store = await asyncio.to_thread(tcp_store, host, port, None, self.attempt.timeout_s, True)
            if port == 0:
                os.makedirs(self.attempt.checkpoint_dir, exist_ok=True)
                self.attempt.publish(f"{host}:{self._store.port}")
                self._published = True
            return host, self._store.port
        if port == 0:
            return await asyncio.to_thread(self.attempt.published)
        return host, port

    def _output(self, rank: int, line: str, stderr: bool) -> None:
        """One line a rank printed: to its log file (and the stderr tail, and stderr_to, for stderr)."""
        log = self._logs.get(rank)
        if log is not None:
            log.write(line + "\n")
        if stderr:
            self.stderr_tail[rank].append(line)
            if self.stderr_to is not None:
                print(f"[rank {rank}] {line}", file=self.stderr_to, flush=True)

    async def _read_records(self, rank: int, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            text, record = parse_record(raw.decode(errors="replace").rstrip("\r\n"))
            if text.strip():
                self._output(rank, text, stderr=False)
            if record is None:
                continue
            self.records.append(record)
            if record.get("event") == "started":
                self._started.add(rank)
            if record.get("event") == "regroup":
                await self._start_joiners(record)
            if self.on_record is not None:
                out = self.on_record(record)
                if inspect.isawaitable(out):
                    await out

    async def _read_stderr(self, rank: int, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            self._output(rank, raw.decode(errors="replace").rstrip(), stderr=True)

    async def _supervise(self, rank: int, proc: asyncio.subprocess.Process) -> tuple[int, int]:
        await asyncio.gather(self._read_records(rank, proc.stdout), self._read_stderr(rank, proc.stderr))
        return rank, await proc.wait()

    async def wait(self) -> LaunchResult:
        """Stream records until every local worker has exited; stop all if one dies."""
        if not self.procs:
            await self.start()
        self._joined = asyncio.Event()  # set when ranks join (an in-place grow): they are supervised too
        supervised: set[int] = set()  # (pids)
        pending: set[asyncio.Future] = set()
        codes: dict[int, int] = {}
        failure = ""
        try:
            while True:
                for rank, proc in list(self.procs.items()):
                    if proc.pid not in supervised:
                        supervised.add(proc.pid)
                        pending.add(asyncio.ensure_future(self._supervise(rank, proc)))
                        if self._stopping:  # a joiner started as the others were being stopped
                            _signal(proc, signal.SIGTERM)
                if not pending:
                    break
                self._joined.clear()
                joined = asyncio.ensure_future(self._joined.wait())
                done, pending = await asyncio.wait(pending | {joined}, return_when=asyncio.FIRST_COMPLETED)
                joined.cancel()
                pending.discard(joined)
                for task in done - {joined}:
                    rank, code = task.result()
                    codes[rank] = code
                    if code != 0 and not failure and not self._stopping:
                        failure = self._failure_message(rank, code)
                        await self.terminate()
        except BaseException:
            await self.terminate()
            raise
        finally:
            self._close_logs()
        return LaunchResult(self._outcome(failure), list(self.records), codes, failure)

    def _close_logs(self) -> None:
        for log in self._logs.values():
            log.close()
        self._logs = {}
        if self._published:
            with contextlib.suppress(OSError):
                os.unlink(self.attempt.rendezvous_file)
        self._store = None  # (the server stops with it)

    def _failure_message(self, rank: int, code: int) -> str:
        """The rank, how it ended, and the error it reported or the last lines of its stderr."""
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        reported = [r["message"] for r in self.records if r.get("event") == "failed" and r.get("rank") == rank]
        lines = [_RANK_PREFIX.sub("", line).strip()[:FAILURE_LINE_CHARS] for line in self.stderr_tail[rank]]
        lines = [line for line in lines if line]
        detail = reported[-1] if reported else " | ".join(lines[-FAILURE_LINES:])
        return f"rank {rank} {how}" + (f": {detail}" if detail else "")

    def _outcome(self, failure: str) -> str:
        if any(r.get("event") == "profile" for r in self.records):
            return "profiled"  # every rank measured (rank 0 reports the slowest): a death after it is teardown
        if failure:
            return "failed"
        for event, outcome in (("finished", "finished"), ("stopped", "stopped")):
            if any(r.get("event") == event for r in self.records):
                return outcome
        return "terminated" if self._stopping else "exited"

    def request_stop(self) -> None:
        """Stop at the next epoch boundary (checkpoint, ``stopped`` record, exit 0); now for ranks that
        cannot (see the module docstring)."""
        if self.attempt.stop_file:
            os.makedirs(os.path.dirname(self.attempt.stop_file) or ".", exist_ok=True)
            with open(self.attempt.stop_file, "w"):
                pass
        if self.spec.is_script and self.procs and not set(self.procs) <= self._started:
            task = asyncio.get_running_loop().create_task(self.terminate())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        for rank in self._started:
            proc = self.procs[rank]
            if proc.returncode is None:
                proc.send_signal(signal.SIGUSR1)

    async def terminate(self) -> None:
        """SIGTERM every live worker, SIGKILL what is left after ``grace_s``."""
        self._stopping = True
        live = [p for p in self.procs.values() if p.returncode is None]
        group = self.spec.is_script  # a script runs in a process group of its own (with its children)
        for p in live:
            _signal(p, signal.SIGTERM, group)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), self.grace_s)
        except asyncio.TimeoutError:
            for p in live:
                if p.returncode is None:
                    _signal(p, signal.SIGKILL, group)
            await asyncio.gather(*(p.wait() for p in live))


def _signal(proc: asyncio.subprocess.Process, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def run_attempt(spec: TrainSpec, attempt: AttemptSpec, ranks: Sequence[int] | None = None,
                on_record: Callable[[dict], object] | None = None, **kwargs) -> LaunchResult:
    """Synchronous: start the attempt's local workers and wait for them."""

    async def go() -> LaunchResult:
        group = WorkerGroup(spec, attempt, ranks, on_record, **kwargs)
        await group.start()
        return await group.wait()

    return asyncio.run(go())


def size_at(epochs_done: int, world_size: int, resizes: Sequence[tuple[int, int]]) -> int:
    """The job's size once ``epochs_done`` epochs are done: it starts at world_size and takes each (epoch,
    size) of resizes at that epoch."""
    for epoch, size in resizes:
        if epoch <= epochs_done:
            world_size = size
    return world_size


def run_local(spec: TrainSpec, checkpoint_dir: str, world_size: int, resizes: Sequence[tuple[int, int]] = (),
              devices: Sequence[str] = (), in_place: bool = True, max_restarts: int = 2,
              on_record: Callable[[dict], object] | None = None, **kwargs) -> LaunchResult:
    """Run a job on this machine with planned resizes ((epoch, size): once epoch epochs are done, go on with
    size ranks), from the warm pool.

    In place (see train.py), or, with in_place False, today's path: the job
    stops at the resize and a new attempt at the new size resumes from the
    checkpoint. When an attempt fails (an in-place regroup whose rank died), up
    to max_restarts new attempts resume from the last checkpoint at the size
    the plan gives for it. The result holds the records of every attempt and
    the outcome of the last."""
    resizes = tuple((int(e), int(w)) for e, w in resizes)
    devices = tuple(devices) or ("cpu",) * max([world_size, *(w for _, w in resizes)])

    async def go() -> LaunchResult:
        pool = WarmPool(kwargs.get("python", sys.executable))
        records: list[dict] = []
        restarts = 0
        try:
            while True:
                found = list_checkpoints(checkpoint_dir)
                done = found[-1][0] if found else 0
                size = size_at(done, world_size, resizes)
                plan = tuple((e, w) for e, w in resizes if e > done)
                ranks = max([size, *(w for _, w in plan)])
                attempt = new_attempt(size, checkpoint_dir, devices[:ranks], resizes=plan, in_place=in_place)
                group = WorkerGroup(spec, attempt, on_record=on_record, pool=pool, **kwargs)
                await group.start()
                result = await group.wait()
                records += result.records
                if result.outcome == "stopped" and plan and not in_place:
                    continue  # a planned resize, by restart
                if result.outcome == "failed" and restarts < max_restarts:
                    restarts += 1
                    continue
                return dataclasses.replace(result, records=records)
        finally:
            await pool.close()

    return asyncio.run(go())
