"""The node lease file: rewritten in place at every renewal, read by every rank at each epoch boundary."""

from __future__ import annotations

import multiprocessing
import time

from omru import lease
from services.executor.worker.spec import AttemptSpec


def test_a_rewritten_lease_reads_back_and_lapses_once_its_deadline_passed(tmp_path):
    path = tmp_path / "node" / "lease"
    writer = lease.LeaseWriter(path)
    assert lease.deadline(str(path)) is None and not lease.lapsed(str(path))  # none yet: nothing to fence
    writer.write(1_000.5)
    writer.write(2_000_000_000.25)  # a longer value over a shorter one leaves nothing of the old behind
    assert lease.deadline(str(path)) == 2_000_000_000.25
    assert not lease.lapsed(str(path), now=2_000_000_000.0) and lease.lapsed(str(path), now=2_000_000_001.0)
    attempt = AttemptSpec(attempt_id="a", world_size=1, rendezvous="127.0.0.1:0", checkpoint_dir=str(tmp_path), lease_file=str(path))
    assert attempt.lease_lapsed(now=2_000_000_001.0) and not AttemptSpec(
        attempt_id="a", world_size=1, rendezvous="127.0.0.1:0", checkpoint_dir=str(tmp_path)).lease_lapsed()
    writer.close()
    writer.write(5.0)  # a renewal after close changes nothing
    assert lease.deadline(str(path)) == 2_000_000_000.25


def test_a_torn_lease_is_never_read_as_a_deadline(tmp_path):
    path = tmp_path / "lease"
    half = f"{1_765_000_001.5:020.6f}"
    path.write_text(f"{half} {1_765_000_003.25:020.6f}\n")  # what a read overlapping a rewrite may see
    assert lease.deadline(str(path)) is None and not lease.lapsed(str(path))


def _rewrite(path: str, until: float) -> None:
    writer, value = lease.LeaseWriter(path), 2_000_000_000.0
    while time.monotonic() < until:
        value += 1.0
        writer.write(value)


def test_reads_during_constant_rewrites_see_only_whole_deadlines(tmp_path):
    path = str(tmp_path / "lease")
    lease.LeaseWriter(path).write(2_000_000_000.0)
    proc = multiprocessing.get_context("spawn").Process(target=_rewrite, args=(path, time.monotonic() + 2.0))
    proc.start()
    try:
        seen = [lease.deadline(path) for _ in range(20_000)]
    finally:
        proc.join(10)
    assert all(v is not None and v >= 2_000_000_000.0 and v == int(v) for v in seen)
