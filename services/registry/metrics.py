"""The registry's Prometheus metrics (served by services/common/metrics.py).

`RegistryMeter` counts, as they happen, the lease renewals (KeepAliveNode calls) and registrations
by outcome; bound to the store, it also reports, read from etcd when scraped, the live nodes, their
GPUs and the GPUs claimed (the planner claims them: omru_planner_claim_seconds times it).
"""

from __future__ import annotations

import contextlib
from typing import Iterable

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

from services.common.etcd import EtcdUnavailable
from services.common.metrics import LoopBridge, LoopCollector, Meter

def _outcome(exc: BaseException | None) -> str:
    from services.registry.store import RegistryError

    if exc is None:
        return "ok"
    if isinstance(exc, RegistryError):
        return exc.kind  # not_found (lease or node gone: the node must register again), failed_precondition ...
    return "unavailable" if isinstance(exc, EtcdUnavailable) else "error"


class RegistryMeter(Meter):
    """Counters and histograms of the registry's calls; with `bind`, a collector of the cluster too."""

    def __init__(self) -> None:
        self.renewals = Counter("omru_registry_lease_renewals",
                                "Node lease renewals (KeepAliveNode calls), by outcome (ok; not_found: the node "
                                "must register again; unavailable: etcd; error)", ["outcome"], registry=None)
        self.registrations = Counter("omru_registry_registrations", "Node registrations (RegisterNode calls), by outcome",
                                     ["outcome"], registry=None)
        self.metrics = (self.renewals, self.registrations)

    @contextlib.contextmanager
    def renewal(self):
        with self._count(self.renewals):
            yield

    @contextlib.contextmanager
    def registration(self):
        with self._count(self.registrations):
            yield

    @contextlib.contextmanager
    def _count(self, counter: Counter):
        outcome = "error"
        try:
            yield
            outcome = "ok"
        except BaseException as exc:
            outcome = _outcome(exc)
            raise
        finally:
            counter.labels(outcome).inc()

    def bind(self, store, bridge: LoopBridge) -> "RegistryMeter":
        """Report the nodes and claims of the RegistryStore too (read from etcd on its loop when scraped)."""
        self.live = _Cluster(store, bridge)
        return self


class _Cluster(LoopCollector):
    name = "registry"

    def __init__(self, store, bridge: LoopBridge) -> None:
        super().__init__(bridge)
        self.store = store

    async def read(self) -> dict:
        nodes, _ = await self.store.list_nodes()
        claims, _ = await self.store.list_claims()
        claimed: dict[str, int] = {}
        for c in claims:
            claimed[c.gpu.node_id] = claimed.get(c.gpu.node_id, 0) + 1
        return {"nodes": {n.node_id: len(n.gpus) for n in nodes}, "claimed": claimed}

    def families(self, s: dict | None) -> Iterable:
        nodes = GaugeMetricFamily("omru_registry_nodes", "Live nodes (registered, lease alive)")
        gpus = GaugeMetricFamily("omru_registry_gpus", "GPUs of each live node", labels=["node"])
        claimed = GaugeMetricFamily("omru_registry_gpus_claimed", "GPUs of each node claimed by a job or trial",
                                    labels=["node"])
        if s is not None:
            nodes.add_metric([], len(s["nodes"]))
            for node, n in sorted(s["nodes"].items()):
                gpus.add_metric([node], n)
                claimed.add_metric([node], s["claimed"].get(node, 0))
        return [nodes, gpus, claimed]
