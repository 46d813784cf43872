"""Partial profiles: a job profiled at some GPU counts only, on a cluster larger than its largest count.

Its largest count is the most GPUs any plan gives it; a count between takes the time of the
nearest measured count below it, a count below the smallest measured one scales it ideally.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from core_builders import CORE_POLICIES, rich_instance
from services.planner.core import bounds, fluid, profiles, registry, simulator, validate
from services.planner.core.model import Cluster, Job, Plan, PlanningError, PlanningInput, Segment
from services.planner.core.policies import omru

TOL = 1 + 1e-9


def batch() -> list[Job]:
    """Two jobs profiled at 1, 2, 4 and 8 GPUs, one with a gap below its smallest count and inside,
    and one profiled on every count up to 64 (it may take the whole cluster)."""
    return [
        Job("a", 40, {1: 100.0, 2: 55.0, 4: 30.0, 8: 18.0}),
        Job("b", 25, {1: 60.0, 2: 33.0, 4: 20.0, 8: 14.0}),
        Job("c", 30, {2: 40.0, 6: 16.0, 24: 7.0}),
        Job("d", 10, {g: 200.0 / g ** 0.8 for g in range(1, 65)}),
    ]


@pytest.mark.parametrize("per_node", [4, 8, 16])
@pytest.mark.parametrize("name", CORE_POLICIES)
def test_every_policy_plans_partial_profiles_on_64_gpus_within_each_jobs_largest_count(name, per_node):
    p = PlanningInput(tuple(batch()), Cluster.of(64, per_node), options={"population": 8, "generations": 20})
    plan = registry.plan(name, p)
    assert validate.violations(plan, p) == []
    assert not plan.unplaced
    widest: dict[str, int] = {}
    for s in plan.segments:
        widest[s.job] = max(widest.get(s.job, 0), len(s.gpus))
    assert widest["a"] <= 8 and widest["b"] <= 8 and widest["c"] <= 24, widest
    assert plan.makespan_s * TOL >= bounds.fluid(p)


@pytest.mark.parametrize("per_node", [4, 16])
@pytest.mark.parametrize("arrivals", [False, True])
def test_every_plan_omru_builds_keeps_the_largest_counts_not_only_the_one_it_returns(per_node, arrivals):
    # Packing gives whole nodes (wider than a job's largest count on nodes of 16), list schedules and
    # node packings grow jobs onto free GPUs: each must stop at the job's largest count.
    jobs = [dataclasses.replace(j, arrival_s=50.0 * i if arrivals else 0.0) for i, j in enumerate(batch())]
    p = PlanningInput(tuple(jobs), Cluster.of(64, per_node))
    D = fluid.durations(p)
    sol = fluid.solve(p, D)
    built = [omru._packed(p, sol, 0.0, (), (False, True)), *omru._listed(p, sol, 0.0, ())]
    built += omru._node_packed(p, sol, D, math.inf) if not arrivals else []
    for plan in built:
        assert validate.violations(plan, p) == []


def test_sequential_gives_each_job_the_gpus_it_can_use_not_the_cluster():
    p = PlanningInput(tuple(batch()), Cluster.of(64, 8))
    widths = {s.job: len(s.gpus) for s in registry.plan("sequential", p).segments}
    assert widths == {"a": 8, "b": 8, "c": 24, "d": 64}


@pytest.mark.parametrize("seed", range(3))
def test_random_partial_profiles_with_placements_arrivals_and_resize_costs_keep_every_rule(seed):
    rng = random.Random(seed)
    base = rich_instance(seed)
    G = base.cluster.gpus
    jobs = []
    for j in base.jobs:
        top = min(G, rng.choice([1, 2, 3, G // 2 or 1, G]))
        keep = {g: t for g, t in j.profile.items() if g == top or (g < top and rng.random() < 0.4)}
        jobs.append(dataclasses.replace(j, profile=keep, placement={k: t for k, t in j.placement.items() if k[0] <= top}))
    p = PlanningInput(tuple(jobs), base.cluster, seed=seed, resize_cost_s=base.resize_cost_s,
                      options={"population": 6, "generations": 10})
    for name in CORE_POLICIES:
        plan = registry.plan(name, p)
        if validate.violations(plan, p):  # reference policies ignore placement and resize cost: charged
            plan = simulator.replay(plan, p)
        assert validate.violations(plan, p) == [], name
        assert all(len(s.gpus) <= p.job(s.job).max_gpus for s in plan.segments), name


def test_a_gap_takes_the_time_of_the_nearest_measured_count_below_and_below_the_smallest_scales_ideally():
    c = Job("c", 3, {2: 40.0, 6: 16.0, 24: 7.0})
    assert c.max_gpus == 24
    assert c.epoch_seconds(1) == 80.0  # 40 s on 2 GPUs, ideally on 1
    assert [c.epoch_seconds(g) for g in (2, 3, 5)] == [40.0, 40.0, 40.0]
    assert [c.epoch_seconds(g) for g in (6, 7, 23)] == [16.0, 16.0, 16.0]
    assert c.epoch_seconds(24) == 7.0
    assert c.table(30) == [c.epoch_seconds(g) for g in range(1, 25)] + [7.0] * 6


def test_a_gap_is_timed_by_the_rule_in_plans_and_in_the_validator():
    jobs = profiles.parse_csv("job,epochs,gpus,epoch_seconds\na,10,1,40\na,10,2,25\na,10,4,15\n")
    p = PlanningInput(tuple(jobs), Cluster.of(16, 4))
    assert jobs[0].epoch_seconds(3) == 25.0
    on_three = Plan("manual", (Segment("a", 0.0, 250.0, (0, 1, 2), 10),))
    assert validate.violations(on_three, p) == []
    short = Plan("manual", (Segment("a", 0.0, 249.0, (0, 1, 2), 10),))
    assert any("need 250" in v for v in validate.violations(short, p))


def test_a_profile_with_no_epoch_time_is_refused_naming_the_job():
    with pytest.raises(PlanningError, match="job 'empty': the profile gives no epoch time"):
        Job("empty", 5, {})


def test_the_validator_refuses_a_segment_wider_than_the_largest_profiled_count():
    p = PlanningInput(tuple(batch()), Cluster.of(64, 8))
    wide = Plan("manual", tuple(
        [Segment("a", 0.0, 40 * 18.0, tuple(range(9)), 40)]
        + [Segment(j.id, 0.0, j.duration(1), (60 + i,), j.epochs) for i, j in enumerate(p.jobs[1:])]))
    found = validate.violations(wide, p)
    assert found == ["segment 0 (a): 9 GPUs, more than job a's largest profiled count (8)"]
    with pytest.raises(PlanningError, match="job 'a' runs on 1 to 8 GPUs"):
        p.jobs[0].epoch_seconds(9)


def test_bounds_are_those_of_jobs_that_cannot_run_wider_than_their_largest_count():
    # The same jobs with full profiles where every count above the largest is prohibitively slow:
    # a job that cannot use more GPUs. The bounds must be the same, not lower.
    jobs = batch()
    G = 64
    slow = [Job(j.id, j.epochs, {g: j.epoch_seconds(g) if g <= j.max_gpus else 1e9 for g in range(1, G + 1)})
            for j in jobs]
    partial = bounds.all_bounds(PlanningInput(tuple(jobs), Cluster.of(G, 8)))
    full = bounds.all_bounds(PlanningInput(tuple(slow), Cluster.of(G, 8)))
    for key, value in partial.to_dict().items():
        assert value == pytest.approx(full.to_dict()[key], rel=1e-6), key
    one = PlanningInput((jobs[0],), Cluster.of(G, 8))
    assert bounds.length(one) == bounds.static(one) == jobs[0].duration(8)
    assert bounds.fluid(one) == pytest.approx(jobs[0].duration(8), rel=1e-9)
