"""Checks of client input (pure): each returns the first problem as
(field, problem) or None. Servicers turn a problem into INVALID_ARGUMENT
"<field>: <problem>" (the planner checks ids with `id_problem` too).
"""

from __future__ import annotations

import re
from typing import Iterable

from omru.v1 import common_pb2

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

Problem = tuple[str, str] | None


def id_problem(field: str, value: str) -> Problem:
    """Missing or malformed id."""
    if not value:
        return field, "is required"
    if not _ID_RE.match(value):
        return field, f"{value!r} is not a valid id ([A-Za-z0-9._-], 1..128 characters, not starting with . _ -)"
    return None


def address_problem(field: str, value: str, port_zero: bool = False) -> Problem:
    """Missing or malformed host:port (port 0 allowed with `port_zero`: a port picked later)."""
    if not value:
        return field, "is required"
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 if port_zero else 1) <= int(port) <= 65535:
        return field, f"{value!r} is not host:port"
    return None


def gpu_refs_problem(field: str, gpus: Iterable[common_pb2.GpuRef], required: bool = True) -> Problem:
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
    if required and count == 0:
        return field, "at least one GPU is required"
    return None


def gpu_infos_problem(field: str, gpus: Iterable[common_pb2.GpuInfo]) -> Problem:
    """Empty list, negative or duplicate indices, missing kinds."""
    seen: set[int] = set()
    count = 0
    for i, gpu in enumerate(gpus):
        count += 1
        if gpu.index < 0:
            return f"{field}[{i}].index", f"{gpu.index} is negative"
        if gpu.index in seen:
            return f"{field}[{i}].index", f"{gpu.index} is listed twice"
        if not gpu.kind:
            return f"{field}[{i}].kind", "is required"
        if gpu.memory_bytes < 0:
            return f"{field}[{i}].memory_bytes", f"{gpu.memory_bytes} is negative"
        seen.add(gpu.index)
    if count == 0:
        return field, "at least one GPU is required"
    return None
