"""Warm workers: an executor keeps a worker with torch imported waiting on each
device; a job starts on it, a successor waits at once, and none outlives the executor."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.executor.service_builders import K, START, directive, executors, gpu, is_event, tiny_job


def standby_children() -> set[int]:
    """pids of this process's children that are warm workers still waiting or running."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"--standby" in cmdline:
            found.add(int(proc.name))
    return found


async def until(predicate, timeout_s: float = 60.0):
    for _ in range(int(timeout_s / 0.1)):
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError("condition not met in time")


async def test_a_job_starts_on_the_waiting_worker_and_a_successor_takes_its_place(registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 1), store=etcd_store) as (ex,):
        waiting = await until(standby_children)
        assert len(waiting) == 1
        events = ex.events()
        await ex.start_job(directive("d1", START, tiny_job("j1", epochs=1), [gpu("n1", 0)]))
        await events.wait_for(is_event("j1", K.EXECUTOR_EVENT_KIND_STARTED))
        assert set((await ex.job("j1")).worker_pids) == waiting  # the warm worker trains
        await events.wait_for(is_event("j1", K.EXECUTOR_EVENT_KIND_FINISHED))
        successor = await until(lambda: standby_children() - waiting)
        assert len(successor) == 1
        events.close()
    await until(lambda: not standby_children(), timeout_s=15)  # stopping the executor let it go
