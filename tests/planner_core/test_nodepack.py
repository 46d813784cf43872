"""Node packing behind `omru` (core/nodepack.py): one node per job, node plans, moves between nodes."""

from __future__ import annotations

import pytest

from core_builders import multi_node_instance
from services.planner.core import fluid, nodepack, validate
from services.planner.core.model import Plan
from services.planner.core.nodepack import NodePacker
from services.planner.core.policies import omru

SEEDS = range(16)


def _pack(p, f: float):
    D = fluid.durations(p)
    return NodePacker(p, D, omru._node_schedule).pack(f * fluid.solve(p).T), D


@pytest.mark.parametrize("seed", SEEDS)
def test_every_job_runs_on_one_node_and_the_plan_keeps_every_rule(seed):
    p = multi_node_instance(seed)
    K = p.cluster.gpus_per_node
    for f in (1.0, 1.3):
        segments, D = _pack(p, f)
        fastest_on_a_node = D[:, :K].min(axis=1).max()
        if segments is None:  # only when some job cannot end by the target on one node
            assert fastest_on_a_node > f * fluid.solve(p).T
            continue
        plan = Plan("omru", tuple(segments))
        assert validate.violations(plan, p) == []
        for job in p.jobs:
            mine = [s for s in segments if s.job == job.id]
            assert sum(s.epochs for s in mine) == job.epochs
            assert len({g // K for s in mine for g in s.gpus}) == 1, job.id


def test_moves_between_nodes_never_end_a_packing_later_and_sometimes_earlier(monkeypatch):
    earlier = 0
    for seed in SEEDS:
        p = multi_node_instance(seed)
        segments, _ = _pack(p, 1.0)
        if segments is None:
            continue
        with monkeypatch.context() as m:
            m.setattr(nodepack, "EVALS", p.cluster.nodes)  # only the first node plans: no moves
            start, _ = _pack(p, 1.0)
        end, first = max(s.end_s for s in segments), max(s.end_s for s in start)
        assert end <= first * (1 + 1e-9), seed
        earlier += end < first * (1 - 1e-6)
    assert earlier >= 2
