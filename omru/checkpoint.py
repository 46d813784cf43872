"""Epoch-end checkpoints: atomic writes, newest-first resume, refusal of foreign ones.

Part of the omru package (no gRPC, torch only to save and load), so that
`omru.elastic` and a user's script need nothing of ``services``; the
executor and its zoo worker use it too.

A checkpoint file ``epoch-NNNNN.pt`` in the job's checkpoint folder holds a
plain dict (tensors, numbers, strings, lists, dicts only, so it loads with
``torch.load(weights_only=True)``; no pickled objects)::

    format        1
    job_id        the job it belongs to
    model_name    e.g. "resnet18"; "script" for a script job's (omru.elastic)
    fingerprint   TrainSpec.fingerprint(): model, classes, input shape, data set
    epoch         epochs completed (training resumes at this epoch index)
    world_size    the world size that wrote it (resume works on any)
    model         state_dict of the bare model (not the DDP wrapper)
    optimizer     optimizer state_dict (SGD momentum buffers, param groups)
    lr_schedule   lsr.LrSchedule.to_dict()
    rng           {"torch": CPU generator state, "cuda": [per-device states]}
    history       the epoch_done records of every epoch so far

Writes go to a temporary file in the same folder, are fsynced and then
``os.replace``d onto the final name, so a reader never sees a torn file. The
two newest checkpoints are kept.
"""

from __future__ import annotations

import os
import re
import tempfile

FORMAT = 1
KEEP = 2
_NAME = re.compile(r"^epoch-(\d{5})\.pt$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used for this job."""


def path_for(checkpoint_dir: str, epoch: int) -> str:
    return os.path.join(checkpoint_dir, f"epoch-{epoch:05d}.pt")


def list_checkpoints(checkpoint_dir: str) -> list[tuple[int, str]]:
    """(epoch, path) of every checkpoint in the folder, oldest first."""
    if not os.path.isdir(checkpoint_dir):
        return []
    found = []
    for name in os.listdir(checkpoint_dir):
        m = _NAME.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(checkpoint_dir, name)))
    return sorted(found)


def latest(checkpoint_dir: str) -> str | None:
    found = list_checkpoints(checkpoint_dir)
    return found[-1][1] if found else None


def save(checkpoint_dir: str, state: dict) -> str:
    """Atomically write ``state`` as the checkpoint of ``state["epoch"]``."""
    import torch  # (here, not above: listing checkpoints must not load torch)

    os.makedirs(checkpoint_dir, exist_ok=True)
    final = path_for(checkpoint_dir, int(state["epoch"]))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=checkpoint_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(checkpoint_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for _, old in list_checkpoints(checkpoint_dir)[:-KEEP]:
        os.unlink(old)
    return final


def load(path: str, model_name: str, fingerprint: str | None) -> dict:
    """Load a checkpoint for a job training ``model_name``; refuse any other (fingerprint None: any
    configuration of it, as for a script's own checkpoints)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several kinds for a bad file
        raise CheckpointError(f"checkpoint {path} cannot be read: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not an OMRU checkpoint (format {FORMAT})")
    if state.get("model_name") != model_name:
        raise CheckpointError(
            f"checkpoint {path} holds model {state.get('model_name')!r}, but this job trains {model_name!r}")
    if fingerprint is not None and state.get("fingerprint") != fingerprint:
        raise CheckpointError(
            f"checkpoint {path} was written for another {model_name} configuration (fingerprint "
            f"{state.get('fingerprint')}, this job {fingerprint}: classes, input size or data set differ)")
    return state
