"""Warm workers: worker processes started ahead of need, torch already imported.

A cold worker spends seconds importing torch and torchvision before it can
rendezvous, while the GPU it was given sits idle. A `WarmPool` keeps one
worker per environment (= per device: the environment fixes
``CUDA_VISIBLE_DEVICES`` and the thread count before torch loads) that has
done those imports and waits on stdin for the arguments of one run
(``python -m services.executor.worker --standby``, see train.py). `spawn`
hands out the waiting one, or starts one cold when none waits, and at once
starts the successor for that environment, so the next attempt on the
device starts warm too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Mapping, Sequence

from services.common.logging import get_logger

log = get_logger(__name__)

#: asyncio stream limit of a worker's stdout (its records can be long lines).
LINE_LIMIT = 16 * 1024 * 1024

Key = tuple[tuple[str, str], ...]


async def start_standby(python: str, env: Mapping[str, str]) -> asyncio.subprocess.Process:
    """A worker process that imports what training needs, then waits for its arguments on stdin."""
    return await asyncio.create_subprocess_exec(
        python, "-m", "services.executor.worker", "--standby",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(env), limit=LINE_LIMIT)


async def hand_arguments(proc: asyncio.subprocess.Process, args: Sequence[str]) -> None:
    """Give a standby worker the arguments of its one run (it starts at once)."""
    proc.stdin.write((json.dumps(list(args)) + "\n").encode())
    await proc.stdin.drain()
    proc.stdin.close()


class WarmPool:
    """At most one waiting worker per environment; see the module docstring."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self._waiting: dict[Key, asyncio.subprocess.Process] = {}
        self._closed = False

    @staticmethod
    def _key(env: Mapping[str, str]) -> Key:
        return tuple(sorted(env.items()))

    def waiting(self) -> list[int]:
        """pids of the workers waiting now."""
        return [p.pid for p in self._waiting.values() if p.returncode is None]

    async def prepare(self, env: Mapping[str, str]) -> None:
        """Have one worker waiting for env (no-op when one is, or after close)."""
        key = self._key(env)
        proc = self._waiting.get(key)
        if self._closed or (proc is not None and proc.returncode is None):
            return
        try:
            self._waiting[key] = await start_standby(self.python, env)
        except OSError as exc:  # a cold start later will say what is wrong
            log.warning("warm_worker_failed", error=str(exc))

    async def spawn(self, args: Sequence[str], env: Mapping[str, str]) -> asyncio.subprocess.Process:
        """A worker running `args` in env: the waiting one if there is one, else a cold one."""
        proc = self._waiting.pop(self._key(env), None)
        if proc is None or proc.returncode is not None:
            proc = await start_standby(self.python, env)
        await hand_arguments(proc, args)
        await self.prepare(env)
        return proc

    async def close(self, grace_s: float = 5.0) -> None:
        """Let every waiting worker go (stdin closed: it exits 0), SIGKILL what stays."""
        self._closed = True
        procs = [p for p in self._waiting.values() if p.returncode is None]
        self._waiting.clear()
        for p in procs:
            with contextlib.suppress(Exception):
                p.stdin.close()
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), grace_s)
        except asyncio.TimeoutError:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
            await asyncio.gather(*(p.wait() for p in procs))
