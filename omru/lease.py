"""The node lease file: until when an executor's registry lease surely holds.

The executor rewrites it at each renewal (every ttl/3 on every node, so it
must be cheap: one in-place write, no new file and no rename); the ranks of
its jobs (zoo workers, `omru.elastic` in a user's script, emulated workers)
read it at each epoch boundary and stop without a checkpoint once it passed.

The file holds the deadline (Unix seconds) twice, fixed width, on one line.
A read that overlaps a rewrite can see part of each value; its two halves
then differ and the read is taken again, so a torn read never passes for a
deadline.
"""

from __future__ import annotations

import os
import time

_WIDTH = 20  # "%020.6f" of a Unix time: the same length at every write
_TRIES = 3


class LeaseWriter:
    """The executor's side: `write(deadline)` rewrites the file in place (nothing once closed)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.deadline: float | None = None  # the last one written (the writer needs no read back)
        self._fd: int | None = None
        self._closed = False

    def write(self, deadline_unix_s: float) -> None:
        if self._closed:
            return
        self.deadline = deadline_unix_s
        if self._fd is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        value = f"{deadline_unix_s:0{_WIDTH}.6f}"
        os.pwrite(self._fd, f"{value} {value}\n".encode(), 0)

    def close(self) -> None:
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def deadline(path: str) -> float | None:
    """The deadline the file holds; None when there is none to read (no file, empty, unreadable)."""
    for _ in range(_TRIES):
        try:
            with open(path, "rb") as f:
                first, _, second = f.read().strip().partition(b" ")
        except OSError:
            return None
        if first and first == second:
            try:
                return float(first)
            except ValueError:
                return None
    return None


def lapsed(path: str, now: float | None = None) -> bool:
    """True when the lease may have lapsed (its deadline passed); False without a deadline to read."""
    held = deadline(path) if path else None
    return held is not None and (time.time() if now is None else now) > held
