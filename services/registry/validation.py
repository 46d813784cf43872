"""Checks of client input (pure): each returns the first problem as
(field, problem) or None. Servicers turn a problem into INVALID_ARGUMENT
"<field>: <problem>"; the planner, profiler and executor check ids and job
specs with these too. The limits are omru.spec's (README, "Input limits"),
and a value a problem echoes is cut by `shown`.
"""

from __future__ import annotations

import math
import re
from typing import Iterable

from omru.spec import MAX_GPUS_PER_NODE, MAX_ID, MAX_ITEMS, MAX_NAME, MAX_TEXT, shown, too_long
from omru.v1 import common_pb2

_ID_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_ID - 1}}}$")

Problem = tuple[str, str] | None


def id_problem(field: str, value: str) -> Problem:
    """Missing or malformed id."""
    if not value:
        return field, "is required"
    if not _ID_RE.match(value):
        return field, f"{shown(value)} is not a valid id ([A-Za-z0-9._-], 1..{MAX_ID} characters, not starting with . _ -)"
    return None


def text_problem(field: str, value: str, limit: int = MAX_TEXT) -> Problem:
    """A string longer than `limit` characters."""
    problem = too_long(value, limit)
    return (field, problem) if problem else None


def address_problem(field: str, value: str, port_zero: bool = False) -> Problem:
    """Missing or malformed host:port (port 0 allowed with `port_zero`: a port picked later)."""
    if not value:
        return field, "is required"
    if len(value) > MAX_NAME:
        return text_problem(field, value, MAX_NAME)
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 if port_zero else 1) <= int(port) <= 65535:
        return field, f"{shown(value)} is not host:port"
    return None


def gpu_refs_problem(field: str, gpus: Iterable[common_pb2.GpuRef]) -> Problem:
    """Empty list, bad node ids, negative indices, duplicates."""
    seen: set[tuple[str, int]] = set()
    count = 0
    for i, gpu in enumerate(gpus):
        count += 1
        problem = id_problem(f"{field}[{i}].node_id", gpu.node_id)
        if problem:
            return problem
        if gpu.index < 0:
            return f"{field}[{i}].index", f"{gpu.index} is negative"
        if (gpu.node_id, gpu.index) in seen:
            return f"{field}[{i}]", f"{gpu.node_id}:{gpu.index} is listed twice"
        seen.add((gpu.node_id, gpu.index))
    if count == 0:
        return field, "at least one GPU is required"
    return None


def gpu_infos_problem(field: str, gpus: Iterable[common_pb2.GpuInfo]) -> Problem:
    """Empty or too long a list, indices out of 0..MAX_GPUS_PER_NODE-1 or twice, missing or too long kinds."""
    gpus = list(gpus)
    if not gpus:
        return field, "at least one GPU is required"
    if len(gpus) > MAX_GPUS_PER_NODE:
        return field, f"{len(gpus)} GPUs, at most {MAX_GPUS_PER_NODE} per node"
    seen: set[int] = set()
    for i, gpu in enumerate(gpus):
        if not 0 <= gpu.index < MAX_GPUS_PER_NODE:
            return f"{field}[{i}].index", f"{gpu.index} is not in 0..{MAX_GPUS_PER_NODE - 1}"
        if gpu.index in seen:
            return f"{field}[{i}].index", f"{gpu.index} is listed twice"
        if not gpu.kind:
            return f"{field}[{i}].kind", "is required"
        if len(gpu.kind) > MAX_NAME:
            return text_problem(f"{field}[{i}].kind", gpu.kind, MAX_NAME)
        if gpu.memory_bytes < 0:
            return f"{field}[{i}].memory_bytes", f"{gpu.memory_bytes} is negative"
        seen.add(gpu.index)
    return None


def job_spec_problem(field: str, job: common_pb2.JobSpec) -> Problem:
    """What a JobSpec holds that no service may take as sent: ids, names, paths and lists over the
    limits, max_gpus below min_gpus or negative, numbers that are not finite. The rest (model
    known, data set well formed, ranges) is the worker's TrainSpec's to check. `field` prefixes
    the names of the fields ("" for none)."""

    def at(name: str) -> str:
        return f"{field}.{name}" if field else name

    problem = id_problem(at("job_id"), job.job_id)
    for name, limit in (("model", MAX_NAME), ("dataset", MAX_TEXT), ("workdir", MAX_TEXT)):
        problem = problem or text_problem(at(name), getattr(job, name), limit)
    if problem:
        return problem
    for name, items in (("command", job.command), ("env", job.env)):
        if len(items) > MAX_ITEMS:
            return at(name), f"{len(items)} entries, at most {MAX_ITEMS}"
    for i, arg in enumerate(job.command):
        problem = problem or text_problem(at(f"command[{i}]"), arg)
    for key, value in sorted(job.env.items()):
        problem = problem or text_problem(at("env"), key, MAX_NAME) or text_problem(at(f"env[{key}]"), value)
    if problem:
        return problem
    for name in ("base_lr", "momentum", "weight_decay"):
        if not math.isfinite(getattr(job, name)):
            return at(name), f"{getattr(job, name)} is not a finite number"
    if job.max_gpus < 0:
        return at("max_gpus"), f"{job.max_gpus} is negative (0 = any number)"
    if job.max_gpus and job.max_gpus < (job.min_gpus or 1):
        return at("max_gpus"), f"{job.max_gpus} is below min_gpus ({job.min_gpus or 1})"
    return None
