"""What the worker processes of an executor's attempts printed, kept on its disk.

Layout under the executor's work folder::

    logs/<job_id>/<n>.<attempt_id>/rank-<rank>.log

n = 1, 2, ... numbers the job's attempts on this node in the order they
started (every restart and resize is a new attempt); each file holds what the
rank wrote to stdout and stderr, line by line in the order it came (records
to the executor excepted). The files stay after the job ends and across
restarts of the executor on the same work folder. A job id is checked
(letters, digits, '.', '_', '-'; never a path) before it names a folder, so
no request reads or writes outside ``logs/``.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable

from services.registry import validation

#: Bytes read from a log per chunk.
CHUNK = 64 * 1024
_RANK_FILE = re.compile(r"^rank-(\d+)\.log$")


class LogError(ValueError):
    """A bad request; ``field`` names the bad field."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name


@dataclass(frozen=True)
class AttemptLogs:
    """The log folder of one attempt of a job on this node."""

    number: int
    attempt_id: str
    folder: Path

    def ranks(self) -> list[int]:
        found = (_RANK_FILE.match(p.name) for p in self.folder.iterdir()) if self.folder.is_dir() else ()
        return sorted(int(m.group(1)) for m in found if m)

    def file(self, rank: int) -> Path:
        return self.folder / f"rank-{rank}.log"


@dataclass(frozen=True)
class Chunk:
    """Bytes of one rank's log; ``offset`` is the position after them."""

    attempt: AttemptLogs
    rank: int
    data: bytes
    offset: int


class LogStore:
    """The ``logs/`` folder of one executor."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def _job_dir(self, job_id: str) -> Path:
        problem = validation.id_problem("job_id", job_id)
        if problem:
            raise LogError(*problem)
        return self.root / job_id

    def new_attempt(self, job_id: str, attempt_id: str) -> AttemptLogs:
        """A fresh folder for the next attempt of the job on this node."""
        known = self.attempts(job_id)
        number = known[-1].number + 1 if known else 1
        attempt = AttemptLogs(number, attempt_id, self._job_dir(job_id) / f"{number}.{attempt_id}")
        attempt.folder.mkdir(parents=True, exist_ok=True)
        return attempt

    def attempts(self, job_id: str) -> list[AttemptLogs]:
        """The job's attempts on this node, oldest first."""
        folder = self._job_dir(job_id)
        found = []
        for p in folder.iterdir() if folder.is_dir() else ():
            number, _, attempt_id = p.name.partition(".")
            if number.isdigit() and attempt_id and p.is_dir():
                found.append(AttemptLogs(int(number), attempt_id, p))
        return sorted(found, key=lambda a: a.number)

    def select(self, job_id: str, attempt: int = 0, rank: int | None = None) -> tuple[AttemptLogs, list[int]]:
        """The attempt (0 = the newest) and its ranks to read; LogError for a bad value, LookupError naming
        what this node does not have."""
        if attempt < 0:
            raise LogError("attempt", f"{attempt} is negative (0 = the newest, 1 = the first, ...)")
        if rank is not None and rank < 0:
            raise LogError("rank", f"{rank} is negative")
        known = self.attempts(job_id)
        if not known:
            raise LookupError(f"job_id: no logs of job {job_id!r} on this node")
        chosen = known[-1] if attempt == 0 else next((a for a in known if a.number == attempt), None)
        if chosen is None:
            raise LookupError(f"attempt: job {job_id!r} has attempts 1..{known[-1].number} on this node, not {attempt}")
        ranks = chosen.ranks()
        if rank is not None:
            if rank not in ranks:
                raise LookupError(f"rank: attempt {chosen.number} of job {job_id!r} ran ranks {ranks} on this "
                                  f"node, not {rank}")
            ranks = [rank]
        return chosen, ranks

    async def read(self, job_id: str, attempt: int = 0, rank: int | None = None, offset: int = 0,
                   follow: bool = False, live: Callable[[Path], bool] = lambda folder: False,
                   poll_s: float = 0.2) -> AsyncIterator[Chunk]:
        """The selected logs from offset on; with follow, then what is printed until live(folder) is False."""
        if offset < 0:
            raise LogError("offset", f"{offset} is negative")
        chosen, ranks = self.select(job_id, attempt, rank)
        positions = dict.fromkeys(ranks, offset)
        while True:
            running = follow and live(chosen.folder)  # (before reading: nothing printed before the end is missed)
            got = False
            for r in ranks:
                while data := _read(chosen.file(r), positions[r]):
                    positions[r] += len(data)
                    got = True
                    yield Chunk(chosen, r, data, positions[r])
            if not running:
                return
            if not got:
                await asyncio.sleep(poll_s)


def _read(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(CHUNK)
    except FileNotFoundError:
        return b""
