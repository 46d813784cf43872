"""A node's Prometheus metrics (served by services/common/metrics.py), read from its Supervisor when
scraped (on the executor's event loop): per job its state, epochs done, world size, restarts and
epoch seconds (from the EPOCH_DONE events of the node's event log: only the node of a job's rank 0
has them), per node the GPUs (slots) it has, holds for running jobs and has free, and its events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from services.common.metrics import LoopBridge, LoopCollector


@dataclass
class _Epochs:
    count: int = 0
    total_s: float = 0.0
    last_s: float = 0.0


@dataclass
class _Log:
    """What was read of the event log so far (it only grows)."""

    seen: int = 0
    epochs: dict[str, _Epochs] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)


class ExecutorCollector(LoopCollector):
    """The node's jobs and GPUs, from the Supervisor (services/executor/supervisor.py) of node_id."""

    name = "executor"

    def __init__(self, node_id: str, supervisor, bridge: LoopBridge) -> None:
        super().__init__(bridge)
        self.node_id, self.supervisor = node_id, supervisor
        self._log = _Log()

    def read(self) -> dict:
        s = self.supervisor
        for e in s.events.since(self._log.seen):  # (on the loop: the log does not grow meanwhile)
            kind = getattr(e.kind, "value", str(e.kind))
            self._log.kinds[kind] = self._log.kinds.get(kind, 0) + 1
            if kind == "epoch_done":
                ep = self._log.epochs.setdefault(e.job_id, _Epochs())
                ep.count, ep.total_s, ep.last_s = ep.count + 1, ep.total_s + e.epoch_seconds, e.epoch_seconds
        self._log.seen = s.events.last_seq
        jobs = [(j.job_id, str(j.state), j.epochs_done, j.world_size, j.restarts, len(j.local_gpus),
                 j.state.active, j.profile) for j in s.jobs()]
        epochs = {k: _Epochs(v.count, v.total_s, v.last_s) for k, v in self._log.epochs.items()}
        return {"jobs": jobs, "gpus": len(s.devices), "epochs": epochs, "kinds": dict(self._log.kinds)}

    def families(self, s: dict | None) -> Iterable:
        node = self.node_id
        labels = ["node", "job"]
        state = GaugeMetricFamily("omru_executor_job_state", "1 for the state of each job's ranks on this node",
                                  labels=[*labels, "state"])
        epochs = GaugeMetricFamily("omru_executor_job_epochs_done", "Epochs each job has done", labels=labels)
        world = GaugeMetricFamily("omru_executor_job_world_size", "GPUs of each job's attempt, on every node",
                                  labels=labels)
        local = GaugeMetricFamily("omru_executor_job_gpus", "GPUs each job holds on this node (0 at rest)",
                                  labels=labels)
        restarts = CounterMetricFamily("omru_executor_job_restarts", "Restarts of each job after worker failures",
                                       labels=labels)
        seconds = SummaryMetricFamily("omru_executor_job_epoch_seconds",
                                      "Seconds of each epoch of each job whose rank 0 runs on this node", labels=labels)
        last = GaugeMetricFamily("omru_executor_job_last_epoch_seconds", "Seconds of each job's last epoch",
                                 labels=labels)
        gpus = GaugeMetricFamily("omru_executor_gpus", "GPUs (CPU slots without GPUs) of this node", labels=["node"])
        held = GaugeMetricFamily("omru_executor_gpus_held", "GPUs of this node held by jobs whose ranks run",
                                 labels=["node"])
        free = GaugeMetricFamily("omru_executor_gpus_free", "GPUs of this node no job holds", labels=["node"])
        events = CounterMetricFamily("omru_executor_events", "Events of this node's event log, by kind",
                                     labels=["node", "kind"])
        if s is not None:
            in_use = 0
            for job_id, st, done, size, restarted, mine, active, _profile in s["jobs"]:
                key = [node, job_id]
                state.add_metric([*key, st], 1)
                epochs.add_metric(key, done)
                world.add_metric(key, size)
                local.add_metric(key, mine if active else 0)
                restarts.add_metric(key, restarted)
                in_use += mine if active else 0
            for job_id, ep in sorted(s["epochs"].items()):
                seconds.add_metric([node, job_id], ep.count, ep.total_s)
                last.add_metric([node, job_id], ep.last_s)
            gpus.add_metric([node], s["gpus"])
            held.add_metric([node], in_use)
            free.add_metric([node], max(0, s["gpus"] - in_use))
            for kind, n in sorted(s["kinds"].items()):
                events.add_metric([node, kind], n)
        return [state, epochs, world, local, restarts, seconds, last, gpus, held, free, events]
