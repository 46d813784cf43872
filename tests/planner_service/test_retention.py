"""Checkpoint retention (services/planner/retention.py): an ended job's folder goes after the retention, an
earlier batch's once nothing in it changed for that long; nothing else under the root, no link followed."""

from __future__ import annotations

import os
import time

import pytest

from services.common import config as cfg
from services.planner import retention
from services.planner.server import parse_config

DAY = 86400.0


def _folder(path, age_s: float, now: float):
    path.mkdir(parents=True)
    (path / "epoch-3.pt").write_bytes(b"x")
    for p in (path / "epoch-3.pt", path):
        os.utime(p, (now - age_s, now - age_s))
    return path


def test_ended_jobs_and_idle_earlier_batches_go_after_the_retention_and_nothing_else(tmp_path):
    now, root = time.time(), tmp_path / "root"
    batch = retention.batch_folder(now - 10 * DAY)
    _folder(root / batch / "old", 9 * DAY, now)  # ended 8 days ago
    _folder(root / batch / "recent", 1 * DAY, now)  # ended a day ago
    _folder(root / batch / "running", 9 * DAY, now)  # not ended: kept however old
    idle = _folder(root / "batch-1000" / "job", 30 * DAY, now)
    os.utime(idle.parent, (now - 30 * DAY, now - 30 * DAY))
    busy = _folder(root / "batch-2000" / "job", 30 * DAY, now)
    (busy / "epoch-4.pt").write_bytes(b"y")  # written just now
    os.utime(busy.parent, (now - 30 * DAY, now - 30 * DAY))
    _folder(root / "trials" / "t1", 30 * DAY, now)  # not a batch: never touched
    outside = _folder(tmp_path / "elsewhere", 30 * DAY, now)
    (root / "batch-3000").symlink_to(outside)  # a link: never followed nor removed
    (root / batch / "linked").symlink_to(outside)
    ended = {"old": now - 8 * DAY, "recent": now - 1 * DAY, "linked": now - 8 * DAY}

    assert retention.expired(root, batch, ended, now, 7 * DAY) == [root / batch / "old", root / "batch-1000"]
    assert retention.sweep(root, batch, ended, now, 7 * DAY) == [root / batch / "old", root / "batch-1000"]
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir() and not p.is_symlink())
    assert left == [batch, f"{batch}/recent", f"{batch}/running", "batch-2000", "batch-2000/job", "trials", "trials/t1"]
    assert (outside / "epoch-3.pt").exists()
    assert retention.sweep(root, batch, ended, now + 7 * DAY, 7 * DAY) == [root / batch / "recent"]


@pytest.mark.parametrize("value", ["-1", "nan", "4e8"])
def test_a_bad_retention_is_refused_naming_it(value):
    with pytest.raises(cfg.ConfigError, match="checkpoint_retention_s"):
        parse_config(["--registry", "127.0.0.1:1", "--profiler", "127.0.0.1:2", "--checkpoint-retention", value], {})


async def test_the_planner_sweeps_its_root_for_ended_jobs(etcd_store, tmp_path):
    from dataclasses import replace

    from services.executor.worker.spec import TrainSpec
    from services.planner import state as st
    from services.planner.dispatcher import Dispatcher

    d = Dispatcher(st.PlannerState(etcd_store), "127.0.0.1:1", "127.0.0.1:1", checkpoint_root=str(tmp_path),
                   checkpoint_retention_s=5.0)
    await d.state.set_origin(1000.0)
    now = time.time()
    for job, state in (("done", st.FINISHED), ("runs", st.RUNNING)):
        r = st.JobRecord(spec=TrainSpec(job_id=job, model="resnet18", epochs=2).to_dict(), state=state)
        d.records[job] = replace(r, finished_s=now - 10.0 if state == st.FINISHED else 0.0)
        _folder(tmp_path / "batch-1000000" / job, 0.0, now)
    assert await d._sweep_checkpoints() == [tmp_path / "batch-1000000" / "done"]
    assert (tmp_path / "batch-1000000" / "runs").is_dir()
    assert await d._sweep_checkpoints() == []  # (not again before its interval)
