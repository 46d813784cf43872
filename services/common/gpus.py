"""What a node offers: its NVML GPUs, or a configured number of CPU slots.

NVML (nvidia-ml-py, module `pynvml`) is asked first; with no NVML library or
no GPU the node offers `slots` CPU slots of kind "cpu" (one worker each).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from omru.v1 import common_pb2

CPU_KIND = "cpu"


def nvml_gpus() -> list[common_pb2.GpuInfo]:
    """The GPUs NVML sees; empty when NVML is missing or finds none."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # NVMLError_LibraryNotFound, driver not loaded, ...
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append(common_pb2.GpuInfo(index=index, kind=name, memory_bytes=int(memory)))
        return gpus
    except pynvml.NVMLError:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def cpu_slots(slots: int) -> list[common_pb2.GpuInfo]:
    """`slots` CPU slots ("virtual GPUs")."""
    return [common_pb2.GpuInfo(index=i, kind=CPU_KIND, memory_bytes=0) for i in range(slots)]


def detect(slots: int, use_gpus: bool = True) -> list[common_pb2.GpuInfo]:
    """NVML GPUs when there are any (and use_gpus), else `slots` CPU slots."""
    return (nvml_gpus() if use_gpus else []) or cpu_slots(slots)


def most_common_kind(kinds: Iterable[str]) -> str:
    """The GPU kind most of the cluster's GPUs are (the first by name on a tie; "" when none): the kind
    a profiling trial runs on when none is asked."""
    counts = Counter(kinds)
    return max(sorted(counts), key=counts.__getitem__) if counts else ""
