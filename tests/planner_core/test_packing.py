"""The packing behind `omru` (core/packing.py): grid, plans, bundles, whole nodes, tail growth."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from services.planner.core import fluid, simulator, validate
from services.planner.core.model import Cluster, Job, Plan, PlanningError, PlanningInput, Segment
from services.planner.core.packing import Grid, Menu, Packer, grow_tail, plans
from services.planner.core.policies import omru
from core_builders import multi_node_instance, rich_instance


def packed(problem: PlanningInput) -> Plan:
    """omru's packing alone (no list-scheduling second opinion)."""
    options = problem.options
    return omru._packed(problem, fluid.solve(problem), options.get("start_s", 0.0), options.get("committed", ()))


@pytest.mark.parametrize("seed", range(30))
def test_earliest_is_the_first_start_where_every_part_fits(seed):
    rng = np.random.default_rng(seed)
    grid = Grid(units=8, dt=1.0)
    grid.add([(int(rng.integers(0, 9)), 1) for _ in range(60)], 0)
    shape = [(int(rng.integers(1, 9)), int(rng.integers(1, 6))) for _ in range(rng.integers(1, 4))]
    s0 = int(rng.integers(0, 30))

    def fits(s: int) -> bool:
        for units, b in shape:
            if any(grid.used[t] + units > 8 for t in range(s, s + b) if t < len(grid.used)):
                return False
            s += b
        return True

    assert grid.earliest(shape, s0) == next(s for s in range(s0, 200) if fits(s))


def test_a_job_mixes_two_hull_counts_only_when_no_single_count_meets_the_window():
    job = Job("a", 10, {1: 100.0, 2: 60.0, 3: 45.0, 4: 30.0})
    tau = np.array([job.epoch_seconds(g) for g in range(1, 5)])
    menu = Menu(tau, fluid.hull_of(tau * job.epochs).counts, 1)
    assert plans(menu, 10, 1000.0, 0.0)[0][1] == ((1, 10),)  # 1 GPU meets 1000 s
    options = plans(menu, 10, 500.0, 5.0)
    assert options == sorted(options, key=lambda p: p[0])
    for _, parts in options:
        assert sum(x for _, x in parts) == 10
        seconds = sum(x * tau[u - 1] for u, x in parts) + 5.0 * (len(parts) - 1)
        assert seconds <= 500.0
    mixes = [parts for _, parts in options if len(parts) == 2]
    assert mixes and all({u for u, _ in parts} <= set(menu.hull) for parts in mixes)
    assert plans(menu, 1, 25.0, 0.0) == []  # one epoch cannot be split, nothing is fast enough


@pytest.mark.parametrize("seed", range(20))
def test_packed_plans_keep_every_rule_on_random_instances(seed):
    for p in (rich_instance(seed), multi_node_instance(seed)):
        plan = packed(p)
        assert validate.violations(plan, p) == []
        assert not plan.unplaced
        if all(j.arrival_s == 0 for j in p.jobs):
            assert plan.makespan_s * (1 + 1e-9) >= fluid.solve(p).T


@pytest.mark.parametrize("seed", range(20))
def test_on_several_nodes_packing_puts_each_job_on_as_few_nodes_as_its_count_allows(seed):
    p = multi_node_instance(seed)
    K = p.cluster.gpus_per_node
    plan = packed(p)
    for s in plan.segments:
        assert p.cluster.nodes_spanned(s.gpus) == -(-len(s.gpus) // K), s


def test_small_jobs_share_a_node_instead_of_taking_one_each():
    # Eight one-GPU jobs on 2 nodes of 4: bundled, they all run at once.
    jobs = tuple(Job(f"j{i}", 10, {g: 100.0 / g ** 0.3 for g in range(1, 9)}) for i in range(8))
    p = PlanningInput(jobs, Cluster(2, 4))
    plan = packed(p)
    assert validate.violations(plan, p) == []
    assert plan.makespan_s == pytest.approx(1000.0)
    assert {len(s.gpus) for s in plan.segments} == {1}


def test_jobs_of_a_bundle_that_ends_late_go_onto_whole_nodes_of_their_own_when_that_ends_by_the_target():
    """Two nodes, target 100 s: X and Y take a node each for 65 s; four small jobs are cheapest on
    one GPU each (45 s), so they share a node in a 45 s bundle that fits after neither. Alone on
    a node each (11.5 s), two after X and two after Y, everything ends by 88 s."""
    def job(name, t1, t4, t3):
        return Job(name, 1, {1: t1, 2: t1 / 2 + 1, 3: t3, **{g: t4 for g in range(4, 9)}})

    big = [job(n, 260.0, 65.0, 90.0) for n in "XY"]
    small = [job(f"s{i}", 45.0, 11.5, 16.0) for i in range(4)]
    p = PlanningInput(tuple(big + small), Cluster(2, 4))
    packer = Packer(p)
    assert [it.job for it in packer.items(100.0) if it.job < 0] == [-1]  # one bundle
    once = packer.segments(*packer.pack(100.0, rounds=1))  # one round: no second try
    assert max(s.end_s for s in once) > 100.0
    segments = packer.segments(*packer.pack(100.0, rounds=8))
    assert validate.violations(Plan("omru", tuple(segments)), p) == []
    assert max(s.end_s for s in segments) == pytest.approx(65.0 + 2 * 11.5)
    assert all(len(s.gpus) == 4 for s in segments if s.job.startswith("s"))


def test_the_job_that_ends_last_grows_onto_a_node_left_idle():
    # A long job on node 0, a short one on node 1: once node 1 is idle the long job takes it too.
    long = Job("long", 100, {g: 40.0 / g for g in range(1, 9)})
    short = Job("short", 10, {g: 40.0 / g for g in range(1, 9)})
    p = PlanningInput((long, short), Cluster(2, 4), resize_cost_s=30.0)
    plan = [Segment("long", 0.0, 1000.0, (0, 1, 2, 3), 100), Segment("short", 0.0, 100.0, (4, 5, 6, 7), 10)]
    grown = grow_tail(p, plan, [0.0] * 8, rounds=8)
    assert validate.violations(Plan("x", tuple(grown)), p) == []
    last = [s for s in grown if s.job == "long"]
    assert len(last) == 2 and last[1].gpus == tuple(range(8)) and last[1].start_s == pytest.approx(100.0)
    assert max(s.end_s for s in grown) == pytest.approx(100.0 + 30.0 + 90 * 5.0)


def test_a_job_on_part_of_a_node_grows_onto_the_rest_of_it_waiting_for_the_gpus_when_that_pays():
    # "tail" runs on GPU 0; "other" holds GPUs 1-3 until 250 s, node 1 is busy until 900 s.
    # Stopping after 2 epochs (200 s) and starting on all of node 0 at 250 s ends at
    # 250 + 30 + 8 x 25 = 480 s, earlier than going on at the next boundary (300 s: 505 s)
    # or staying on 1 GPU (1,000 s).
    tail = Job("tail", 10, {g: 100.0 / g for g in range(1, 9)})
    other = Job("other", 1, {g: 750.0 / g for g in range(1, 9)})
    busy = Job("busy", 1, {g: 3600.0 / g for g in range(1, 9)})
    p = PlanningInput((tail, other, busy), Cluster(2, 4), resize_cost_s=30.0)
    plan = [Segment("tail", 0.0, 1000.0, (0,), 10), Segment("other", 0.0, 250.0, (1, 2, 3), 1),
            Segment("busy", 0.0, 900.0, (4, 5, 6, 7), 1)]
    grown = grow_tail(p, plan, [0.0] * 8, rounds=1)
    assert validate.violations(Plan("x", tuple(grown)), p) == []
    first, second = sorted((s for s in grown if s.job == "tail"), key=lambda s: s.start_s)
    assert (first.end_s, first.epochs) == (200.0, 2)
    assert second.gpus == (0, 1, 2, 3) and second.start_s == 250.0 and second.end_s == pytest.approx(480.0)


def test_growing_that_would_not_pay_its_resize_cost_is_left_out():
    long = Job("long", 100, {g: 40.0 / g for g in range(1, 9)})
    short = Job("short", 10, {g: 40.0 / g for g in range(1, 9)})
    p = PlanningInput((long, short), Cluster(2, 4), resize_cost_s=10_000.0)
    plan = [Segment("long", 0.0, 1000.0, (0, 1, 2, 3), 100), Segment("short", 0.0, 100.0, (4, 5, 6, 7), 10)]
    assert grow_tail(p, plan, [0.0] * 8, rounds=8) == plan


@pytest.mark.parametrize("seed", range(8))
def test_online_packing_keeps_clear_of_committed_gpus_and_pays_restarts(seed):
    p = multi_node_instance(seed)
    rng = random.Random(seed)
    p = PlanningInput(tuple(Job(j.id, j.epochs, j.profile, arrival_s=rng.choice([0.0, rng.uniform(0, 3000)]),
                                placement=j.placement) for j in p.jobs), p.cluster, resize_cost_s=30.0)
    plan, _ = simulator.online(packed, p, "omru")
    assert validate.violations(plan, p) == []


def test_packer_units_are_gpus_on_one_node_and_nodes_on_several():
    one = PlanningInput((Job("a", 1, {1: 1.0, 2: 1.0}),), Cluster(1, 2))
    many = PlanningInput((Job("a", 1, {g: 1.0 for g in range(1, 9)}),), Cluster(2, 4))
    assert (Packer(one).unit, Packer(one).units) == (1, 2)
    assert (Packer(many).unit, Packer(many).units) == (4, 2)


def test_omru_starts_a_mixed_job_narrow_so_waiting_jobs_start_at_once_and_it_grows_onto_gpus_they_release():
    # the demo's shape: one job that gains from a second GPU, four that do not
    r18 = {1: 6.5, 2: 4.3}
    jobs = (Job("long", 36, r18), Job("g", 4, {1: 5.0, 2: 5.05}), Job("r50", 2, {1: 15.5, 2: 15.6}),
            Job("b", 3, r18), Job("c", 2, r18))
    problem = PlanningInput(jobs, Cluster.of(2), resize_cost_s=3.0)
    plan = omru.omru(problem)
    assert validate.violations(plan, problem) == []
    long = sorted((s for s in plan.segments if s.job == "long"), key=lambda s: s.start_s)
    assert [len(s.gpus) for s in long] == [1, 2], long  # narrow first, then wide
    others = [s for s in plan.segments if s.job != "long"]
    assert min(s.start_s for s in others) == 0.0  # a waiting job starts beside it at once
    assert long[1].start_s >= max(s.end_s for s in others)  # it grows once they released their GPU
    assert plan.makespan_s <= fluid.solve(problem).T * 1.02


def test_omru_makespan_tolerance_trades_a_near_equal_makespan_for_earlier_completions_and_names_a_bad_value():
    # the demo as the planner service sees it: a start overhead of 4 s spread over each job's epochs
    r18 = {1: 6.5, 2: 4.3}
    spec = [("long", 36, r18), ("g", 4, {1: 5.0, 2: 5.05}), ("r50", 2, {1: 15.5, 2: 15.65}), ("b", 3, r18), ("c", 2, r18)]
    jobs = tuple(Job(i, e, {g: t + 4.0 / e for g, t in p.items()}) for i, e, p in spec)
    problem = PlanningInput(jobs, Cluster.of(2), resize_cost_s=4.0)

    def completions(plan):
        ends = {}
        for s in plan.segments:
            ends[s.job] = max(ends.get(s.job, 0.0), s.end_s)
        return sum(ends.values())

    exact = omru.omru(problem)
    tolerant = omru.omru(dataclasses.replace(problem, options={"makespan_tolerance": 0.02}))
    assert validate.violations(tolerant, problem) == []
    assert exact.makespan_s <= tolerant.makespan_s <= exact.makespan_s * 1.02
    assert completions(tolerant) < completions(exact)
    with pytest.raises(PlanningError, match="makespan_tolerance.*1.5"):
        omru.omru(dataclasses.replace(problem, options={"makespan_tolerance": 1.5}))


def test_omru_with_a_deadline_returns_the_best_plan_found_by_then_and_names_a_bad_value():
    problem = multi_node_instance(5)
    # a deadline that has passed once planning began: the first packing alone, a valid plan all the same
    hurried = omru.omru(dataclasses.replace(problem, options={"deadline_s": 1e-9}))
    first = omru._packed(problem, fluid.solve(problem), 0.0, (), (False,), expired=lambda: True)
    assert hurried.segments == first.segments
    assert validate.violations(hurried, problem) == []
    for bad in (0, -1.0, "1s", True):
        with pytest.raises(PlanningError, match=f"deadline_s.*{bad!r}"):
            omru.omru(dataclasses.replace(problem, options={"deadline_s": bad}))


def test_running_jobs_go_on_on_their_own_gpus_rather_than_swap_them():
    # a runs on node 1, b on node 0; both go on once their current epochs end at 10 s. Placed in job
    # order, a took the GPUs that came free last first (node 0, b's) and b node 1's: a swap that
    # neither job can make in a real cluster before the other has left, and two restarts.
    profile = {1: 60.0, 2: 30.0, 3: 20.0, **{g: 10.0 for g in range(4, 9)}}  # 4 GPUs: the efficient count
    for long in ("a", "b"):
        jobs = (Job("a", 40 if long == "a" else 4, profile), Job("b", 4 if long == "a" else 40, profile))
        committed = (Segment("a", 0.0, 10.0, (4, 5, 6, 7), 1), Segment("b", 0.0, 10.0, (0, 1, 2, 3), 1))
        problem = PlanningInput(jobs, Cluster(2, 4), resize_cost_s=5.0,
                                options={"committed": committed, "start_s": 0.0})
        plan = packed(problem)
        assert validate.violations(plan, problem) == []
        assert {s.job: s.gpus for s in plan.segments} == {"a": (4, 5, 6, 7), "b": (0, 1, 2, 3)}
        assert plan.makespan_s == pytest.approx(10.0 + 40 * 10.0)  # no restart
