"""Explicit GPU ids for slices that share a time window.

The reference algorithms only say how many GPUs a job gets in a batch; here
each slice gets concrete ids, keeping every job on as few nodes as possible:
whole free nodes for the multiple-of-a-node part, then the best-fitting node
(fewest free GPUs that still fit) for the rest.
"""

from __future__ import annotations

from services.planner.core.model import Cluster, PlanningError


def assign(cluster: Cluster, counts: list[int]) -> list[tuple[int, ...]]:
    """GPU ids for each requested count, disjoint, in the order asked.

    Larger requests are placed first (they are the hardest to keep on few
    nodes); the result is returned in the caller's order.
    """
    if sum(counts) > cluster.gpus:
        raise PlanningError(f"{sum(counts)} GPUs asked at once, the cluster has {cluster.gpus}")
    K = cluster.gpus_per_node
    free: list[list[int]] = [list(range(n * K, (n + 1) * K)) for n in range(cluster.nodes)]
    out: list[tuple[int, ...]] = [()] * len(counts)
    for i in sorted(range(len(counts)), key=lambda i: -counts[i]):
        out[i] = tuple(sorted(_take(free, counts[i], K)))
    return out


def _take(free: list[list[int]], g: int, K: int) -> list[int]:
    taken: list[int] = []
    # Whole nodes first.
    while g - len(taken) >= K:
        node = next((n for n, f in enumerate(free) if len(f) == K), None)
        if node is None:
            break
        taken += free[node]
        free[node] = []
    rest = g - len(taken)
    while rest > 0:
        fits = [n for n, f in enumerate(free) if len(f) >= rest]
        if fits:
            node = min(fits, key=lambda n: (len(free[n]), n))
        else:  # no single node fits: take from the emptiest-used node
            node = max(range(len(free)), key=lambda n: (len(free[n]), -n))
        k = min(rest, len(free[node]))
        taken += free[node][:k]
        free[node] = free[node][k:]
        rest -= k
    return taken
