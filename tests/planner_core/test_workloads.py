"""The bench's Pollux workloads (bench/workloads.py, from ../shared/data): sound bounds, and omru on them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import workloads  # noqa: E402

from services.planner.core import fluid, registry, validate  # noqa: E402
from services.planner.core.model import Cluster, PlanningInput  # noqa: E402

pytestmark = pytest.mark.skipif(bool(workloads.missing()), reason="../shared/data is not there")


def pollux_problem(n: int, nodes: int, seed: int = 0) -> PlanningInput:
    return PlanningInput(workloads.pollux_batch(n, nodes, seed), Cluster(nodes, workloads.GPUS_PER_NODE),
                         resize_cost_s=30.0)


@pytest.mark.parametrize("app", sorted(workloads.APPS))
def test_no_pollux_placement_is_faster_than_the_profile_so_lb_fluid_is_a_bound(app):
    s = workloads.pollux(app)
    assert all(t >= s.profile[g] for (g, _), t in s.spread.items())


def test_omru_is_within_5_percent_of_lb_fluid_on_the_50_job_pollux_batch_and_beats_the_rigid_baselines():
    p = pollux_problem(50, 16)
    plan = validate.check(registry.plan("omru", p), p)
    assert plan.makespan_s <= 1.05 * fluid.solve(p).T
    for name in ("fifo", "min-total-duration"):
        assert plan.makespan_s < registry.plan(name, p).makespan_s, name
