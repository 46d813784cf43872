"""Invariants over seeded random instances: every plan of every policy keeps the
validator's rules and is never shorter than the lower bounds that apply to it."""

from __future__ import annotations

import random

import pytest

from core_builders import ALL_POLICIES, STATIC_POLICIES, problem, random_jobs, random_shape
from services.planner.core import bounds, registry, validate

SEEDS = range(24)
TOL = 1 + 1e-9


def _instance(seed: int):
    n, gpus, per_node, monotone = random_shape(seed)
    jobs = random_jobs(random.Random(1000 + seed), n, gpus, monotone)
    # A small GA keeps the suite fast; the decoder and operators are the same.
    return problem(jobs, gpus, per_node, seed=seed, population=8, generations=15)


def test_shapes_cover_1_to_20_jobs_1_to_64_gpus_monotone_and_not():
    shapes = [random_shape(s) for s in SEEDS]
    assert min(s[0] for s in shapes) <= 3 and max(s[0] for s in shapes) >= 15
    assert min(s[1] for s in shapes) <= 2 and max(s[1] for s in shapes) == 64
    assert {s[3] for s in shapes} == {True, False}
    assert any(s[2] < s[1] for s in shapes)  # multi-node clusters too


@pytest.mark.parametrize("seed", SEEDS)
def test_every_policy_plan_passes_the_validator_and_respects_lower_bounds(seed):
    p = _instance(seed)
    lb = bounds.all_bounds(p)
    assert lb.fluid_s * TOL >= max(lb.length_s, lb.area_s)
    assert lb.static_s * TOL >= lb.fluid_s
    whole = bounds.whole_epochs(p)
    assert whole * TOL >= lb.fluid_s
    for name in ALL_POLICIES:
        plan = registry.plan(name, p)
        assert validate.violations(plan, p) == [], name
        assert plan.makespan_s * TOL >= whole, name
        if name in STATIC_POLICIES:
            assert plan.makespan_s * TOL >= lb.static_s, name
        assert 0 < plan.utilization(p) <= 1 + 1e-9


@pytest.mark.parametrize("seed", range(20))
def test_gpu_ids_are_disjoint_and_the_largest_request_spans_the_fewest_nodes(seed):
    from services.planner.core import placement
    from services.planner.core.model import Cluster

    rng = random.Random(seed)
    c = Cluster(nodes=rng.randint(1, 8), gpus_per_node=rng.choice([1, 2, 4, 8]))
    counts, left = [], c.gpus
    while left and rng.random() < 0.8:
        counts.append(rng.randint(1, left))
        left -= counts[-1]
    ids = placement.assign(c, counts)
    flat = [g for s in ids for g in s]
    assert [len(s) for s in ids] == counts
    assert len(flat) == len(set(flat)) and all(0 <= g < c.gpus for g in flat)
    if counts:
        big = max(range(len(counts)), key=lambda i: counts[i])
        assert c.nodes_spanned(ids[big]) == -(-counts[big] // c.gpus_per_node)


def test_gpu_ids_of_a_batch_prefer_whole_nodes_and_best_fit():
    from services.planner.core import placement
    from services.planner.core.model import Cluster

    c = Cluster(nodes=3, gpus_per_node=4)
    ids = placement.assign(c, [2, 5, 3, 2])
    assert sorted(g for s in ids for g in s) == list(range(12))
    assert [c.nodes_spanned(s) for s in ids] == [1, 2, 1, 1]


def test_genetic_search_is_deterministic_for_a_seed():
    p = _instance(5)
    a, b = registry.plan("omru-ga", p), registry.plan("omru-ga", p)
    assert a == b


def test_machines_of_different_sizes_are_nodes_of_their_common_divisor_timed_by_machines_spanned():
    from services.planner.core.model import Cluster, PlanningInput

    c = Cluster.of_sizes([8, 4, 2])
    assert (c.nodes, c.gpus_per_node, c.hosts, c.gpus) == (7, 2, (0, 0, 0, 0, 1, 1, 2), 14)
    assert c.nodes_spanned(range(8)) == 1 and c.nodes_spanned([7, 8]) == 2 and c.nodes_spanned([0, 12]) == 2
    assert Cluster.of_sizes([4, 4]) == Cluster.of(8, 4)
    with pytest.raises(Exception, match=r"\[4, 0\]"):
        Cluster.of_sizes([4, 0])
    # jobs that slow down with every machine they span: the live policy's plan is valid on these terms
    # (the paper's reproductions time every spread by the profile, on any cluster)
    rng = random.Random(7)
    jobs = []
    for job in random_jobs(rng, 8, c.gpus, True):
        spreads = {(g, k): t * (1 + 0.5 * (k - 1)) for g, t in job.profile.items() for k in (2, 3) if k <= g}
        jobs.append(type(job)(job.id, job.epochs, job.profile, placement=spreads))
    p = PlanningInput(tuple(jobs), c, seed=1, options={"population": 8, "generations": 15})
    assert validate.violations(registry.plan("omru", p), p) == []
    # one job of 8 GPUs runs on the 8-GPU machine at its one-machine time
    profile = {g: 80.0 / g if g <= 8 else 10.0 + g - 8 for g in range(1, 15)}  # best on 8
    alone = PlanningInput((type(jobs[0])("a", 3, profile, placement={(8, 2): 20.0, (8, 3): 30.0}),), c)
    assert registry.plan("omru", alone).makespan_s == pytest.approx(30.0)
