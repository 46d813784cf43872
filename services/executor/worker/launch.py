"""Start the local worker processes of one attempt and supervise them.

`WorkerGroup` starts one ``python -m services.executor.worker`` process per
local rank (handed out by a `warm.WarmPool` when it has one: torch already
imported) (all ranks, or the subset ``ranks`` this node hosts when a job spans
nodes), with ``CUDA_VISIBLE_DEVICES`` set to the rank's GPU, or
``OMP_NUM_THREADS=1`` on a CPU slot. It parses each worker's JSON record stream
(schema: `services.executor.worker.train`) and hands every record to
``on_record`` (a plain function or a coroutine function), keeps the tail of each
worker's stderr, and notices a dead worker: when any rank exits non-zero, the
others are stopped (SIGTERM, then SIGKILL after ``grace_s``) and the attempt's
outcome is ``failed``, with a message naming the rank and its exit code.

`request_stop()` asks the job to stop at the next epoch boundary (it creates
the attempt's stop file and sends SIGUSR1 to ranks that have started); the
workers checkpoint, report ``stopped`` and exit 0.

Built on asyncio (the executor servicer is grpc.aio); `run_attempt` is the
synchronous wrapper for `omru train` and scripts.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
import os
import signal
import socket
import sys
import uuid
from dataclasses import dataclass, field
from typing import Callable, Sequence

from services.executor.worker.spec import AttemptSpec, ProfileSpec, TrainSpec, to_json
from services.executor.worker.warm import WarmPool, hand_arguments, start_standby

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


def new_attempt(world_size: int, checkpoint_dir: str, devices: Sequence[str] = (), host: str = "127.0.0.1",
                profile: ProfileSpec | None = None, attempt_id: str | None = None,
                timeout_s: float = 300.0) -> AttemptSpec:
    """An attempt on this machine: fresh id (store prefix), free port, per-attempt stop file."""
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
    )


@dataclass
class LaunchResult:
    """How an attempt ended.

    outcome: ``finished`` (all epochs done), ``stopped`` (at an epoch boundary,
    on request), ``profiled``, ``exited`` (all local ranks exited 0 without a
    final record: ranks > 0 on a node that does not host rank 0), ``terminated``
    (`WorkerGroup.terminate` was called), ``failed`` (a rank exited non-zero).
    """

    outcome: str
    records: list[dict] = field(default_factory=list)
    returncodes: dict[int, int] = field(default_factory=dict)
    message: str = ""

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
                 stderr_to=None, pool: WarmPool | None = None):
        self.spec, self.attempt = spec, attempt
        self.ranks = list(range(attempt.world_size)) if ranks is None else list(ranks)
        bad = [r for r in self.ranks if not 0 <= r < attempt.world_size]
        if bad or len(set(self.ranks)) != len(self.ranks) or not self.ranks:
            raise ValueError(f"ranks {self.ranks} must be distinct and in 0..{attempt.world_size - 1}")
        self.on_record, self.python, self.grace_s = on_record, python, grace_s
        self.base_env = dict(os.environ if env is None else env)
        self.stderr_to = stderr_to
        self.pool = pool  # warm workers to start from (else each rank starts cold)
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.records: list[dict] = []
        self.stderr_tail = {r: collections.deque(maxlen=stderr_lines) for r in self.ranks}
        self._started: set[int] = set()
        self._stopping = False

    @property
    def pids(self) -> dict[int, int]:
        return {r: p.pid for r, p in self.procs.items()}

    async def start(self) -> None:
        if self.attempt.stop_file and os.path.exists(self.attempt.stop_file):
            os.unlink(self.attempt.stop_file)
        payload = to_json(self.spec, self.attempt)
        for rank in self.ranks:
            args = ["--spec-json", payload, "--rank", str(rank)]
            env = worker_env(self.base_env, self.attempt.devices[rank])
            if self.pool is not None:
                self.procs[rank] = await self.pool.spawn(args, env)
            else:
                self.procs[rank] = proc = await start_standby(self.python, env)
                await hand_arguments(proc, args)

    async def _read_records(self, rank: int, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                self.stderr_tail[rank].append(line)
                continue
            if not isinstance(record, dict):
                continue
            self.records.append(record)
            if record.get("event") == "started":
                self._started.add(rank)
            if self.on_record is not None:
                out = self.on_record(record)
                if inspect.isawaitable(out):
                    await out

    async def _read_stderr(self, rank: int, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            self.stderr_tail[rank].append(line)
            if self.stderr_to is not None:
                print(f"[rank {rank}] {line}", file=self.stderr_to, flush=True)

    async def _supervise(self, rank: int) -> tuple[int, int]:
        proc = self.procs[rank]
        await asyncio.gather(self._read_records(rank, proc.stdout), self._read_stderr(rank, proc.stderr))
        return rank, await proc.wait()

    async def wait(self) -> LaunchResult:
        """Stream records until every local worker has exited; stop all if one dies."""
        if not self.procs:
            await self.start()
        pending = {asyncio.ensure_future(self._supervise(r)) for r in self.ranks}
        codes: dict[int, int] = {}
        failure = ""
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    rank, code = task.result()
                    codes[rank] = code
                    if code != 0 and not failure and not self._stopping:
                        failure = self._failure_message(rank, code)
                        await self.terminate()
        except BaseException:
            await self.terminate()
            raise
        return LaunchResult(self._outcome(failure), list(self.records), codes, failure)

    def _failure_message(self, rank: int, code: int) -> str:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        msg = f"rank {rank} (pid {self.procs[rank].pid}) {how}"
        reported = [r["message"] for r in self.records if r.get("event") == "failed" and r.get("rank") == rank]
        if reported:
            msg += f": {reported[-1]}"
        elif self.stderr_tail[rank]:
            msg += f"; last stderr line: {self.stderr_tail[rank][-1]}"
        return msg

    def _outcome(self, failure: str) -> str:
        if failure:
            return "failed"
        for event, outcome in (("finished", "finished"), ("stopped", "stopped"), ("profile", "profiled")):
            if any(r.get("event") == event for r in self.records):
                return outcome
        return "terminated" if self._stopping else "exited"

    def request_stop(self) -> None:
        """Stop at the next epoch boundary (checkpoint, ``stopped`` record, exit 0)."""
        if self.attempt.stop_file:
            os.makedirs(os.path.dirname(self.attempt.stop_file) or ".", exist_ok=True)
            with open(self.attempt.stop_file, "w"):
                pass
        for rank in self._started:
            proc = self.procs[rank]
            if proc.returncode is None:
                proc.send_signal(signal.SIGUSR1)

    async def terminate(self) -> None:
        """SIGTERM every live worker, SIGKILL what is left after ``grace_s``."""
        self._stopping = True
        live = [p for p in self.procs.values() if p.returncode is None]
        for p in live:
            _signal(p, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), self.grace_s)
        except asyncio.TimeoutError:
            for p in live:
                if p.returncode is None:
                    _signal(p, signal.SIGKILL)
            await asyncio.gather(*(p.wait() for p in live))


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


def run_attempt(spec: TrainSpec, attempt: AttemptSpec, ranks: Sequence[int] | None = None,
                on_record: Callable[[dict], object] | None = None, **kwargs) -> LaunchResult:
    """Synchronous: start the attempt's local workers and wait for them."""

    async def go() -> LaunchResult:
        group = WorkerGroup(spec, attempt, ranks, on_record, **kwargs)
        await group.start()
        return await group.wait()

    return asyncio.run(go())
