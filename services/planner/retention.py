"""Checkpoint retention: which folders under the checkpoint root the planner removes, and when.

A job's checkpoints lie in <root>/batch-<origin in ms>/<job> (the dispatcher
names them); while it runs, its workers keep the last few there
(omru/checkpoint.py KEEP). Once a job ended (finished, failed, cancelled) its
folder stays `retention_s` after its end, to be read or resumed by hand, then
goes. A batch folder other than the current batch's goes once nothing in it
changed for `retention_s` (the planner keeps no records of earlier batches'
jobs). Only folders named so are removed, never a link, never anything else
under the root (a trial's rendezvous folder, an operator's files).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Mapping

BATCH = re.compile(r"batch-\d+")


def batch_folder(origin_s: float | None) -> str:
    """The folder name of the batch that began at origin_s (Unix seconds)."""
    return f"batch-{int((origin_s or 0) * 1000)}"


def _newest(folder: Path) -> float:
    """The latest change (mtime) of the folder, its entries and theirs (two levels: jobs, checkpoints)."""
    newest = folder.lstat().st_mtime
    for entry in os.scandir(folder):
        newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
        if entry.is_dir(follow_symlinks=False):
            for inner in os.scandir(entry.path):
                newest = max(newest, inner.stat(follow_symlinks=False).st_mtime)
    return newest


def expired(root: Path, batch: str, ended: Mapping[str, float], now: float, retention_s: float) -> list[Path]:
    """The folders to remove now: in the current batch's folder, those of the jobs of `ended` (job -> when
    it ended, Unix seconds) that ended retention_s ago or more; other batch folders nothing in which
    changed for that long."""
    out = []
    current = root / batch
    if current.is_dir() and not current.is_symlink():
        for job, end in sorted(ended.items()):
            folder = current / job
            if end + retention_s <= now and folder.is_dir() and not folder.is_symlink():
                out.append(folder)
    if root.is_dir():
        for entry in sorted(os.scandir(root), key=lambda e: e.name):
            if (BATCH.fullmatch(entry.name) and entry.name != batch and entry.is_dir(follow_symlinks=False)
                    and _newest(Path(entry.path)) + retention_s <= now):
                out.append(Path(entry.path))
    return out


def sweep(root: Path, batch: str, ended: Mapping[str, float], now: float, retention_s: float) -> list[Path]:
    """Remove what `expired` names; the folders removed (one that vanished meanwhile counts as removed)."""
    removed = []
    for folder in expired(root, batch, ended, now, retention_s):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder)
    return removed
