"""The planner's Prometheus metrics (served by services/common/metrics.py).

`PlannerMeter` is both what the Dispatcher counts as it happens (reconciles, the seconds the core
took to plan, the claim transactions of PlannerState.change) and, as a collector, the planner's
state read when scraped: jobs by state, the queue (jobs that wait for GPUs), each unfinished job's
epochs done, world size and state, the GPUs it owns and the live ones, the plan in force, whether it
leads. The counters and histograms belong to no registry until a service registers the meter.
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from services.common.metrics import LoopBridge, LoopCollector, Meter

#: Buckets (seconds) of a plan, and of a claim transaction.
PLAN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Job states (omru.v1.JobState without the prefix), every one reported (0 included).
STATES = ("PENDING", "PROFILING", "WAITING", "STARTING", "RUNNING", "RESIZING", "FINISHED", "FAILED", "CANCELLED")
#: The states of a job that waits for GPUs (the queue).
QUEUED = ("PENDING", "PROFILING", "WAITING")


class PlannerMeter(Meter):
    """Counters and histograms of the planner's events; with `bind`, a collector of its state too."""

    def __init__(self) -> None:
        self.reconciles = Counter("omru_planner_reconciles", "Replans (reconcile passes) started", registry=None)
        self.plan_seconds = Histogram("omru_planner_plan_seconds", "Wall seconds the planning core took per plan",
                                      buckets=PLAN_BUCKETS, registry=None)
        self.claim_seconds = Histogram(
            "omru_planner_claim_seconds",
            "Seconds of the desired-state transactions that claim GPUs (PlannerState.change), by outcome "
            "(claimed; taken: a GPU was claimed already; lease_gone: a node's lease is gone; error)",
            ["outcome"], buckets=CLAIM_BUCKETS, registry=None)
        self.metrics = (self.reconciles, self.plan_seconds, self.claim_seconds)

    # --- what the dispatcher counts ---------------------------------------------

    def reconciled(self) -> None:
        self.reconciles.inc()

    def planned(self, seconds: float) -> None:
        self.plan_seconds.observe(seconds)

    def claimed(self, seconds: float, outcome: str) -> None:
        self.claim_seconds.labels(outcome).observe(seconds)

    # --- as a collector ---------------------------------------------------------

    def bind(self, dispatcher, bridge: LoopBridge) -> "PlannerMeter":
        """Report the dispatcher's state too (read on its loop)."""
        self.live = _PlannerState(dispatcher, bridge)
        return self


class _PlannerState(LoopCollector):
    name = "planner"

    def __init__(self, dispatcher, bridge: LoopBridge) -> None:
        super().__init__(bridge)
        self.dispatcher = dispatcher

    def read(self) -> dict:
        d = self.dispatcher
        jobs = [(r.job_id, r.state, r.epochs_done, r.epochs, r.world_size) for r in d.records.values()]
        owned: dict[str, int] = {}
        for job_id in d.owner.values():
            owned[job_id] = owned.get(job_id, 0) + 1
        return {"jobs": jobs, "owned": owned, "live": len(d.live_gpus()) if d.leading else 0,
                "nodes": len(d.nodes), "leading": d.leading, "plan_version": d.plan_version,
                "overhead_s": d.overhead_s}

    def families(self, s: dict | None) -> Iterable:
        leading = GaugeMetricFamily("omru_planner_leader", "1 when this planner leads (acts), 0 on standby")
        by_state = GaugeMetricFamily("omru_planner_jobs", "Jobs by state", labels=["state"])
        queue = GaugeMetricFamily("omru_planner_queue_length",
                                  "Jobs waiting for GPUs (PENDING, PROFILING or WAITING)")
        epochs = GaugeMetricFamily("omru_planner_job_epochs_done", "Epochs done of each unfinished job", labels=["job"])
        total = GaugeMetricFamily("omru_planner_job_epochs", "Epochs to train of each unfinished job", labels=["job"])
        world = GaugeMetricFamily("omru_planner_job_world_size", "GPUs each unfinished job runs on (0: none)",
                                  labels=["job"])
        state = GaugeMetricFamily("omru_planner_job_state", "1 for each unfinished job's state", labels=["job", "state"])
        owned = GaugeMetricFamily("omru_planner_gpus_owned", "GPUs the planner's claims hold for jobs and trials")
        live = GaugeMetricFamily("omru_planner_gpus", "GPUs of the live nodes, as the leading planner sees them")
        nodes = GaugeMetricFamily("omru_planner_nodes", "Live nodes, as the leading planner sees them")
        version = GaugeMetricFamily("omru_planner_plan_version", "Version of the plan in force")
        overhead = GaugeMetricFamily("omru_planner_start_overhead_seconds",
                                     "Mean measured start overhead of a job (the prior until one is measured)")
        if s is not None:
            leading.add_metric([], 1 if s["leading"] else 0)
            counts = dict.fromkeys(STATES, 0)
            for job_id, st, done, to_train, size in s["jobs"]:
                counts[st] = counts.get(st, 0) + 1
                if st in ("FINISHED", "FAILED", "CANCELLED"):
                    continue
                epochs.add_metric([job_id], done)
                total.add_metric([job_id], to_train)
                world.add_metric([job_id], size if st in ("STARTING", "RUNNING", "RESIZING") else 0)
                state.add_metric([job_id, st], 1)
            for st, n in counts.items():
                by_state.add_metric([st], n)
            queue.add_metric([], sum(counts[q] for q in QUEUED))
            owned.add_metric([], sum(s["owned"].values()))
            live.add_metric([], s["live"])
            nodes.add_metric([], s["nodes"])
            version.add_metric([], s["plan_version"])
            overhead.add_metric([], s["overhead_s"])
        return [leading, by_state, queue, epochs, total, world, state, owned, live, nodes, version, overhead]
