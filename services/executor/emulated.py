"""Emulated nodes: the real executor (directives, claims, event log, restarts,
resizes at epoch boundaries, checkpoint files) with emulated workers.

`EmulatedRuntime` replaces only the worker processes (supervisor.Runtime): an
attempt's local ranks are one asyncio task that reports what a worker reports
(started, epoch_done, stopped, finished) but sleeps instead of training. It
reports started once its ranks met; an attempt that resumes from a
checkpoint (a restart after a resize, a preemption or a lost node) then
spends ``resize_cost_s / speed`` (the core's resize cost: a job's first
start, like its first planned segment, pays none); each
epoch takes ``epoch_seconds(gpus, nodes spanned) / speed`` wall seconds from the
job's profile (the "hardware truth"), times a lognormal factor of mean 1 and
coefficient of variation ``noise`` drawn from (seed, job, epoch).
Epoch seconds are reported in job seconds (wall x speed), as a real worker
would report them on hardware ``speed`` times slower.

The ranks of an attempt meet through its checkpoint folder, which every node
shares (as real multi-node jobs need): each node's part writes
``.emu-<attempt>/node-<node_id>`` with its ranks and touches it while it
lives (every BEAT_S); the part that holds rank 0 waits for all ranks, runs
the clock, fails the attempt when a peer's file goes stale (as a collective
times out when a rank's node is gone), writes a small JSON checkpoint
``epoch-NNNNN.pt`` per epoch (the supervisor's names) and, at the end,
``.emu-<attempt>/end``, which ends the other nodes' parts. A stop request on
any node (the attempt's stop file, as for real workers) stops the job at the
next epoch boundary.

`main` runs several emulated nodes in one process, each a real
ExecutorService on its own port with its own registry lease:

    python -m services.executor.emulated --registry HOST:PORT \\
        --node-ids node-0,node-1 --gpus-per-node 4 --profiles CSV [--task T] \\
        --speed 100 [--noise 0.1] [--resize-cost 30] [--seed 0] --work-dir DIR \\
        [--checkpoint-root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from omru import checkpoint
from services.executor.worker.launch import LaunchResult
from services.executor.worker.spec import AttemptSpec, TrainSpec
from services.planner.core.model import Job

#: Kind of an emulated node's GPUs in the registry.
EMULATED_KIND = "emulated"
#: How often a part without rank 0 looks for its attempt's end, and rank 0 for its peers (wall seconds).
POLL_S = 0.05
#: Wall seconds after which a peer part that stopped touching its file counts as gone.
PEER_TIMEOUT_S = 2.0
#: How often a part touches its file (and a part without rank 0 looks at rank 0's): often enough for
#: PEER_TIMEOUT_S, rarely enough that hundreds of live parts cost little.
BEAT_S = PEER_TIMEOUT_S / 8
#: Fewest wall seconds the ranks of an attempt wait for each other (the attempt's timeout / speed, at least this).
MIN_RENDEZVOUS_S = 10.0
CHECKPOINT_FORMAT = "emulated-1"


def epoch_seconds(job: Job, gpus: int, nodes: int, gpus_per_node: int) -> float:
    """The job's true epoch time on `gpus` GPUs over `nodes` nodes.

    A measured placement gives it; the profile's time for the count holds on
    the fewest nodes that fit the GPUs (the CSV's row without `nodes`); an
    unmeasured spread costs the known placement of that count with the
    nearest node count (the wider one at a tie).
    """
    placed = {k: t for (g, k), t in job.placement.items() if g == gpus}
    placed.setdefault(-(-gpus // gpus_per_node), job.epoch_seconds(gpus))
    return placed[min(placed, key=lambda k: (abs(k - nodes), -k))]


def noise_factor(seed: int, job_id: str, epoch: int, cv: float) -> float:
    """Lognormal, mean 1, coefficient of variation cv; the same for the same (seed, job, epoch)."""
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    digest = hashlib.sha256(f"{seed}/{job_id}/{epoch}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big")).lognormvariate(-sigma * sigma / 2, sigma)


@dataclass(frozen=True)
class Emulation:
    """What every emulated worker of a cluster shares."""

    jobs: Mapping[str, Job]  # the profiles, by job id
    speed: float = 1.0
    noise: float = 0.0
    resize_cost_s: float = 0.0  # job seconds a restart from a checkpoint costs
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ValueError(f"speed {self.speed!r} must be positive")
        if not self.noise >= 0:
            raise ValueError(f"noise {self.noise!r} must be >= 0")
        if not self.resize_cost_s >= 0:
            raise ValueError(f"resize cost {self.resize_cost_s!r} must be >= 0")


def emulated_gpus(count: int) -> list:
    """What an emulated node offers the registry: `count` GPUs of kind EMULATED_KIND."""
    from services.common import gpus

    offered = gpus.cpu_slots(count)
    for g in offered:
        g.kind = EMULATED_KIND
    return offered


class EmulatedRuntime:
    """supervisor.Runtime of one emulated node."""

    def __init__(self, emulation: Emulation, node_id: str, devices: int) -> None:
        self.emulation = emulation
        self.node_id = node_id
        self.devices = devices  # GPUs of this node (all nodes of an emulation have as many)

    def group(self, spec: TrainSpec, attempt: AttemptSpec, ranks: Sequence[int], on_record, log_dir) -> "EmulatedGroup":
        return EmulatedGroup(self, spec, attempt, ranks, on_record)

    def checkpoint_problem(self, spec: TrainSpec, checkpoint_dir: str) -> str:
        found = checkpoint.list_checkpoints(checkpoint_dir)
        if not found:
            return ""
        try:
            state = json.loads(Path(found[-1][1]).read_text())
        except (OSError, ValueError) as exc:
            return f"checkpoint {found[-1][1]} cannot be read: {exc}"
        if state.get("format") != CHECKPOINT_FORMAT or state.get("job_id") != spec.job_id:
            return f"checkpoint {found[-1][1]} is not an emulated checkpoint of job {spec.job_id!r}"
        return ""


class EmulatedGroup:
    """The local ranks of one attempt on one emulated node (the interface of launch.WorkerGroup)."""

    def __init__(self, runtime: EmulatedRuntime, spec: TrainSpec, attempt: AttemptSpec, ranks: Sequence[int],
                 on_record) -> None:
        self.runtime, self.spec, self.attempt, self.ranks = runtime, spec, attempt, list(ranks)
        self.on_record = on_record
        self.procs: dict = {}  # no processes: supervisor views list none
        self.records: list[dict] = []
        self.folder = Path(attempt.checkpoint_dir) / f".emu-{attempt.attempt_id}"
        self._task: asyncio.Task | None = None
        self._stop = False
        self._terminated = False

    async def start(self) -> None:
        if self.attempt.stop_file and os.path.exists(self.attempt.stop_file):
            os.unlink(self.attempt.stop_file)
        self.folder.mkdir(parents=True, exist_ok=True)
        _write(self.folder / f"node-{self.runtime.node_id}", json.dumps(self.ranks))
        self._task = asyncio.get_running_loop().create_task(self._run())

    def request_stop(self) -> None:
        self._stop = True
        if self.attempt.stop_file:
            with contextlib.suppress(OSError):
                Path(self.attempt.stop_file).touch()

    async def terminate(self) -> None:
        self._terminated = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait(self) -> LaunchResult:
        if self._task is None:
            await self.start()
        try:
            outcome = await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if not self._terminated:
                raise
            outcome = "terminated"
        except Exception as exc:  # the emulation's own failure: as a rank that died
            return LaunchResult("failed", list(self.records), {r: 1 for r in self.ranks}, f"emulated rank failed: {exc}")
        return LaunchResult(outcome, list(self.records), {r: 0 for r in self.ranks})

    def _emit(self, event: str, **fields) -> None:
        record = {"event": event, "time": time.time(), **fields}
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def _stop_wanted(self) -> bool:
        return self._stop or bool(self.attempt.stop_file and os.path.exists(self.attempt.stop_file))

    async def _run(self) -> str:
        if 0 not in self.ranks:
            return await self._follow()
        nodes, peers = await self._gather()
        # the other parts watch this one as it watches them
        beat = asyncio.get_running_loop().create_task(self._beat(self.folder / "leader")) if peers else None
        try:
            return await self._lead(nodes, peers)
        finally:
            if beat is not None:
                beat.cancel()

    async def _lead(self, nodes: int, peers: list[Path]) -> str:
        em = self.runtime.emulation
        found = checkpoint.list_checkpoints(self.attempt.checkpoint_dir)
        start = found[-1][0] if found else 0
        lr = self.spec.base_lr * self.attempt.world_size * self.spec.batch_size / self.spec.base_batch
        for rank in self.ranks:
            self._emit("started", rank=rank, start_epoch=start, backend="emulated", device=EMULATED_KIND, lr=lr,
                       global_batch=self.attempt.world_size * self.spec.batch_size,
                       resumed_from=found[-1][1] if found else "")
        if found:  # the restart's cost: the GPUs are held, nothing trains
            await asyncio.sleep(em.resize_cost_s / em.speed)
        job = em.jobs[self.spec.job_id]
        true_s = epoch_seconds(job, self.attempt.world_size, nodes, self.runtime.devices)
        began = due = time.time()
        for epoch in range(start + 1, self.spec.epochs + 1):
            seconds = true_s * noise_factor(em.seed, self.spec.job_id, epoch, em.noise)
            # epochs end on the profile's schedule: the emulator's own work (checkpoint, events, a busy
            # process) runs inside an epoch's time, as a real worker's does, instead of adding to it
            due += seconds / em.speed
            await asyncio.sleep(max(0.0, due - time.time()))
            self._check_peers(peers)
            if self.attempt.lease_lapsed():
                raise RuntimeError(f"node lease lapsed during epoch {epoch}: stopped without a checkpoint")
            self._checkpoint(epoch)
            accuracy = 1 - 0.9 ** epoch
            self._emit("epoch_done", epoch=epoch, epochs=self.spec.epochs, epoch_seconds=seconds, loss=1 - accuracy,
                       accuracy=accuracy, lr=lr, world_size=self.attempt.world_size,
                       global_batch=self.attempt.world_size * self.spec.batch_size, steps=1, nodes=nodes)
            if epoch < self.spec.epochs and self._stop_wanted():
                self._emit("stopped", epoch=epoch)
                _write(self.folder / "end", "stopped")
                return "stopped"
        self._emit("finished", epochs=self.spec.epochs, accuracy=1 - 0.9 ** self.spec.epochs,
                   loss=0.9 ** self.spec.epochs, seconds=(time.time() - began) * em.speed)
        _write(self.folder / "end", "finished")
        return "finished"

    def _rendezvous_s(self) -> float:
        return max(self.attempt.timeout_s / self.runtime.emulation.speed, MIN_RENDEZVOUS_S)

    async def _beat(self, path: Path) -> None:
        while True:
            path.touch()
            await asyncio.sleep(BEAT_S)

    async def _gather(self) -> tuple[int, list[Path]]:
        """Wait until every rank of the attempt joined; the number of nodes they span and the peers' files."""
        deadline = time.monotonic() + self._rendezvous_s()
        mine = self.folder / f"node-{self.runtime.node_id}"
        while True:
            files, ranks = [], 0
            for f in self.folder.glob("node-*"):
                with contextlib.suppress(OSError, ValueError):
                    ranks += len(json.loads(f.read_text()))
                    files.append(f)
            if ranks >= self.attempt.world_size:
                return len(files), [f for f in files if f != mine]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ranks} of {self.attempt.world_size} ranks joined within {self._rendezvous_s():.0f} s")
            await asyncio.sleep(POLL_S)

    async def _follow(self) -> str:
        """A part without rank 0: started at once, ends when rank 0's part ends, fails when rank 0 never
        comes (the rendezvous times out) or stops answering."""
        for rank in self.ranks:
            self._emit("started", rank=rank, start_epoch=0, backend="emulated", device=EMULATED_KIND)
        end, leader = self.folder / "end", self.folder / "leader"
        mine = self.folder / f"node-{self.runtime.node_id}"
        deadline = time.monotonic() + self._rendezvous_s()
        beat = 0.0  # when this part last touched its file and looked at rank 0's
        while not end.exists():
            if time.monotonic() - beat >= BEAT_S:
                beat = time.monotonic()
                mine.touch()
                try:
                    age = time.time() - leader.stat().st_mtime
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"rank 0 did not come within {self._rendezvous_s():.0f} s") from None
                else:
                    if age > PEER_TIMEOUT_S and not end.exists():
                        raise RuntimeError(f"rank 0 stopped answering {age:.1f} s ago")
            await asyncio.sleep(POLL_S)
        return "exited"

    def _check_peers(self, peers: Sequence[Path]) -> None:
        """RuntimeError naming a peer part that is gone (its file not touched for PEER_TIMEOUT_S)."""
        now = time.time()
        for f in peers:
            try:
                age = now - f.stat().st_mtime
            except OSError:
                age = math.inf
            if age > PEER_TIMEOUT_S:
                raise RuntimeError(f"the ranks on {f.name.removeprefix('node-')} stopped answering {age:.1f} s ago")

    def _checkpoint(self, epoch: int) -> None:
        """Epoch's checkpoint; the one checkpoint.KEEP epochs older goes (epochs are written in order, so
        that keeps the newest KEEP without listing the folder)."""
        folder = self.attempt.checkpoint_dir
        _write(Path(checkpoint.path_for(folder, epoch)), json.dumps(
            {"format": CHECKPOINT_FORMAT, "job_id": self.spec.job_id, "epoch": epoch,
             "world_size": self.attempt.world_size}))
        if epoch > checkpoint.KEEP:
            with contextlib.suppress(OSError):
                os.unlink(checkpoint.path_for(folder, epoch - checkpoint.KEEP))


def _write(path: Path, text: str) -> None:
    """Atomically (a reader on another node never sees half a file)."""
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- several emulated nodes in one process -------------------------------------------------


async def serve(args: argparse.Namespace) -> None:
    import signal

    from services.common import config as cfg
    from services.common.logging import get_logger
    from services.common.server import print_ready
    from services.executor import server
    from services.planner.core import profiles

    jobs = {j.id: j for j in profiles.load_csv(args.profiles, task=args.task)}
    emulation = Emulation(jobs, args.speed, args.noise, args.resize_cost, args.seed)
    token = os.environ.get("OMRU_AUTH_TOKEN") or None
    started = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for node_id in args.node_ids:
            config = cfg.ExecutorConfig(
                node_id=node_id, server=cfg.ServerConfig(host=args.host, port=0, auth_token=token),
                registry=args.registry, slots=args.gpus_per_node, ttl_seconds=args.ttl,
                work_dir=Path(args.work_dir) / node_id, warm_workers=False, checkpoint_root=args.checkpoint_root)
            started.append(await server.start(config, runtime=EmulatedRuntime(emulation, node_id, args.gpus_per_node),
                                              node_gpus=emulated_gpus(args.gpus_per_node)))
        print_ready(service="emulated-nodes", nodes={n: r.address for n, (r, _) in zip(args.node_ids, started)},
                    address=started[0][0].address if started else "")
        await stop.wait()
    finally:
        get_logger(__name__).info("emulated_nodes_stopping", nodes=len(started))
        await asyncio.gather(*(running.stop() for running, _ in started), return_exceptions=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.executor.emulated", description=__doc__.splitlines()[0])
    p.add_argument("--registry", required=True)
    p.add_argument("--node-ids", required=True, type=lambda s: s.split(","), help="comma-separated node ids")
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--profiles", required=True, help="profile CSV (omru simulate's contract)")
    p.add_argument("--task", default=None)
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--noise", type=float, default=0.0)
    p.add_argument("--resize-cost", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ttl", type=int, default=5)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--work-dir", required=True)
    p.add_argument("--checkpoint-root", type=Path, default=None,
                   help="the folder the planner's directives put checkpoints in (default: the executor's)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from services.common.logging import configure

    configure("emulated-nodes")
    if os.environ.get("OMRU_DIE_WITH_PARENT") == "1":
        from services.common.cluster import die_with_parent

        die_with_parent()
    args = parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
