"""Issue 7: the `omru` policy, the cluster baselines, the engine's rules and the simulator."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from services.planner.core import bounds, fluid, profiles, registry, simulator, validate
from services.planner.core.engine import Engine, resizes
from services.planner.core.model import Cluster, Job, Plan, PlanningError, PlanningInput, Segment
from services.planner.core.policies import omru
from core_builders import example_problem, random_jobs, reference_rows, rich_instance

NEW_POLICIES = ("omru", "fifo", "sjf", "tiresias", "min-total-duration")
TOL = 1 + 1e-9


@pytest.mark.parametrize("seed", range(30))
def test_exact_fluid_solution_equals_the_lp_bound(seed):
    rng = random.Random(seed)
    G = rng.choice([1, 2, 3, 4, 8, 16])
    p = PlanningInput(tuple(random_jobs(rng, rng.randint(1, 15), G, monotone=bool(seed % 2))), Cluster.of(G))
    assert fluid.solve(p).T == pytest.approx(bounds.fluid(p), rel=1e-7)


@pytest.mark.parametrize("seed", range(24))
def test_every_new_policy_keeps_placement_resize_and_arrival_rules(seed):
    p = rich_instance(seed)
    whole = bounds.whole_epochs(p)  # counts arrivals and restarts
    for name in NEW_POLICIES:
        plan = registry.plan(name, p)
        assert validate.violations(plan, p) == [], name
        assert not plan.unplaced, name
        for s in plan.segments:
            assert s.start_s >= p.job(s.job).arrival_s - 1e-9, name
        assert plan.makespan_s * TOL >= whole, name


@pytest.mark.parametrize("seed", range(12))
def test_reference_policies_become_valid_when_replayed_with_placement_and_resize_cost(seed):
    p = dataclasses.replace(rich_instance(seed), options={"generations": 5})
    for name in ("omru-ga", "optimus", "parallel"):
        plan = simulator.replay(registry.plan(name, p), p)
        assert validate.violations(plan, p) == [], name


def test_replay_leaves_a_plan_that_keeps_every_rule_unchanged():
    p = rich_instance(3)
    plan = registry.plan("omru", p)
    assert simulator.replay(plan, p).segments == tuple(sorted(plan.segments, key=lambda s: (s.start_s, s.end_s, s.gpus)))


@pytest.mark.parametrize("task,G", [(t, g) for t in ("image", "action") for g in (2, 4, 8)])
def test_omru_is_within_2_percent_of_lb_fluid_and_never_worse_than_omru_ga_on_the_paper_data(task, G):
    p = example_problem(task, G)
    plan = validate.check(registry.plan("omru", p), p)
    assert plan.makespan_s <= 1.02 * bounds.fluid(p)
    ga = next(r for r in reference_rows() if r["task"] == task and int(r["gpus"]) == G and r["algorithm"] == "omru-ga")
    assert plan.makespan_s / 60 <= float(ga["makespan_min"])


def test_omru_runs_the_jobs_that_scale_well_wide_and_first_so_one_epoch_jobs_get_the_counts_they_need():
    # Two one-epoch jobs (no resize can help them: 405 s on 2 GPUs, 210 s on 4) beside two
    # 60-epoch jobs that scale almost linearly to a node. Starting all four at once on 2 GPUs
    # each ends at 405 s; the elastic jobs on a node each first (72 s), then the one-epoch jobs
    # on a node each, end at 282 s, 2.6 % above LB_fluid (275 s).
    rigid = dict(enumerate([800, 405, 300, 210, 205, 200, 198, 196], 1))
    elastic = dict(enumerate([4.5, 2.3, 1.55, 1.2, 1.1, 0.9, 0.75, 0.65], 1))
    jobs = [Job(f"rigid{i}", 1, rigid) for i in range(2)] + [Job(f"elastic{i}", 60, elastic) for i in range(2)]
    p = PlanningInput(tuple(jobs), Cluster(2, 4), resize_cost_s=5.0)
    plan = validate.check(registry.plan("omru", p), p)
    assert plan.makespan_s <= 1.03 * fluid.solve(p).T
    for s in plan.segments:
        if s.job.startswith("rigid"):
            assert len(s.gpus) == 4 and len({g // 4 for g in s.gpus}) == 1


def test_a_job_started_for_some_of_its_epochs_waits_again_then_and_its_next_start_pays_the_restart():
    class WideFirst:  # 2 epochs on 4 GPUs, then the rest on 2
        quantum_s = None

        def __init__(self):
            self.calls = 0

        def step(self, e):
            if 0 in e.waiting():
                self.calls += 1
                e.start(0, 4, 2) if self.calls == 1 else e.start(0, 2)

    p = PlanningInput((Job("a", 5, {1: 40.0, 2: 20.0, 3: 14.0, 4: 10.0}),), Cluster(1, 4), resize_cost_s=7.0)
    plan = Engine(p, WideFirst()).run("wide-first")
    assert validate.violations(plan, p) == []
    first, second = sorted(plan.segments, key=lambda s: s.start_s)
    assert (len(first.gpus), first.epochs, first.end_s) == (4, 2, 20.0)
    assert (len(second.gpus), second.epochs, second.start_s) == (2, 3, 20.0)
    assert second.end_s == pytest.approx(20.0 + 7.0 + 3 * 20.0)


def _grown(patient: bool) -> Plan:
    # "a" runs on 2 of 4 GPUs; "c" frees a GPU at 5 s, "b" another at 100 s
    jobs = (Job("a", 100, {1: 40.0, 2: 20.5, 3: 14.0, 4: 10.8}), Job("b", 1, {g: 100.0 for g in range(1, 5)}), Job("c", 1, {g: 5.0 for g in range(1, 5)}))
    p = PlanningInput(jobs, Cluster(1, 4), resize_cost_s=30.0)
    policy = omru._Omru([2, 1, 1], [0, 1, 2], fluid.solve(p).hulls, math.inf, patient=patient)
    return validate.check(Engine(p, policy).run("omru"), p)


def test_a_patient_grow_waits_for_gpus_about_to_come_free_when_that_ends_the_job_earlier():
    eager, patient = _grown(False), _grown(True)
    # eager: 2 -> 3 GPUs at 20.5 s, 3 -> 4 at 106.5 s; patient: 2 -> 4 at 102.5 s, one restart fewer
    assert [len(s.gpus) for s in sorted(eager.segments, key=lambda s: s.start_s) if s.job == "a"] == [2, 3, 4]
    assert [len(s.gpus) for s in sorted(patient.segments, key=lambda s: s.start_s) if s.job == "a"] == [2, 4]
    assert patient.makespan_s == pytest.approx(102.5 + 30 + 95 * 10.8)
    assert eager.makespan_s == pytest.approx(106.5 + 30 + 95 * 10.8)


def test_a_loose_job_starts_on_its_target_count_whatever_the_deadline():
    jobs = (Job("a", 8, {1: 40.0, 2: 20.0, 3: 14.0, 4: 10.0}),)
    p = PlanningInput(jobs, Cluster(1, 4), resize_cost_s=30.0)
    hulls = fluid.solve(p).hulls
    for loose, count in ((frozenset(), 4), (frozenset({0}), 1)):  # 8 epochs by 100 s need 4 GPUs
        plan = Engine(p, omru._Omru([1], [0], hulls, 100.0, loose=loose)).run("omru")
        assert len(sorted(plan.segments, key=lambda s: s.start_s)[0].gpus) == count


def test_validator_rejects_a_restart_on_new_gpus_that_does_not_pay_the_resize_cost():
    p = PlanningInput((Job("a", 2, {1: 10.0, 2: 6.0}),), Cluster.of(2), resize_cost_s=30.0)
    cheap = Plan("x", (Segment("a", 0, 10, (0,), 1), Segment("a", 10, 16, (0, 1), 1)))
    assert any("resize cost" in v for v in validate.violations(cheap, p))
    paid = Plan("x", (Segment("a", 0, 10, (0,), 1), Segment("a", 10, 46, (0, 1), 1)))
    assert validate.violations(paid, p) == []
    same = Plan("x", (Segment("a", 0, 10, (0,), 1), Segment("a", 10, 20, (0,), 1)))
    assert validate.violations(same, p) == [] and resizes(same) == 0 and resizes(paid) == 1


def test_spread_placement_is_charged_its_slower_time():
    slow = Job("a", 1, {1: 10.0, 2: 6.0}, placement={(2, 2): 9.0})
    p = PlanningInput((slow,), Cluster(2, 1))
    assert validate.violations(Plan("x", (Segment("a", 0, 6, (0, 1), 1),)), p)
    assert registry.plan("omru", p).makespan_s == pytest.approx(9.0)


def test_online_replay_never_shows_a_policy_a_job_before_it_arrives():
    p = rich_instance(5)
    p = dataclasses.replace(p, jobs=tuple(dataclasses.replace(j, arrival_s=100.0 * i) for i, j in enumerate(p.jobs)))
    seen = []

    def spy(sub: PlanningInput) -> Plan:
        seen.append((sub.options["start_s"], max(j.arrival_s for j in sub.jobs)))
        return registry.plan("omru", sub)

    plan, replans = simulator.online(spy, p, "omru")
    assert replans == len(p.jobs)
    assert all(arrival <= now for now, arrival in seen)
    assert validate.violations(plan, p) == []


def _long_then_short() -> PlanningInput:
    # "long" scales badly past one GPU but takes both at first, when it is alone;
    # "short" arrives 100 s in and needs both GPUs.
    long = Job("long", 100, {1: 10.0, 2: 9.0}, requested_gpus=2)
    short = Job("short", 10, {1: 20.0, 2: 10.0}, arrival_s=100.0, requested_gpus=2)
    return PlanningInput((long, short), Cluster.of(2), resize_cost_s=5.0)


def test_online_replay_lets_omru_revise_a_running_job_when_a_job_arrives():
    p = _long_then_short()
    plan, replans = simulator.online(registry.get("omru"), p, "omru")
    assert replans == 2 and validate.violations(plan, p) == []
    long = sorted((s for s in plan.segments if s.job == "long"), key=lambda s: s.start_s)
    # kept up to its first epoch boundary after the arrival (100 s on 2 GPUs at 9 s an epoch: 12 epochs)
    assert (long[0].start_s, long[0].end_s, long[0].epochs) == (0.0, pytest.approx(108.0), 12)
    # then "short" runs beside "long" instead of waiting 900 s for all of it (what the plan made
    # at 0 s said), and the batch ends earlier than that plan (1,000 s)
    short_start = min(s.start_s for s in plan.segments if s.job == "short")
    assert short_start < max(s.end_s for s in plan.segments if s.job == "long")
    assert plan.makespan_s < 0.95 * (100 * 9.0 + 10 * 10.0)


@pytest.mark.parametrize("name", ["fifo", "sjf"])
def test_online_replay_never_preempts_a_rigid_queue(name):
    p = _long_then_short()
    plan, _ = simulator.online(registry.get(name), p, name)
    assert validate.violations(plan, p) == [] and resizes(plan) == 0
    long_end = max(s.end_s for s in plan.segments if s.job == "long")
    assert long_end == pytest.approx(900.0)
    assert min(s.start_s for s in plan.segments if s.job == "short") == pytest.approx(long_end)


@pytest.mark.parametrize("name", NEW_POLICIES)
def test_online_plans_of_every_new_policy_pass_the_validator(name):
    p = rich_instance(8)
    plan, _ = simulator.online(registry.get(name), p, name)
    assert validate.violations(plan, p) == []


def test_rigid_baselines_keep_the_requested_gpu_count():
    p = rich_instance(2)
    for name in ("fifo", "sjf", "tiresias", "min-total-duration"):
        for s in registry.plan(name, p).segments:
            assert len(s.gpus) == p.job(s.job).requested_gpus, name


def test_profiles_read_nodes_arrival_and_requested_gpus_columns():
    text = ("job,epochs,gpus,epoch_seconds,nodes,arrival_s,requested_gpus\n"
            "a,10,1,10,,0,2\na,10,2,6,1,,\na,10,2,7,2,,\nb,5,1,8,,30,\nb,5,2,5,,30,1\n")
    a, b = profiles.parse_csv(text)
    assert a.profile == {1: 10.0, 2: 6.0} and a.placement == {(2, 1): 6.0, (2, 2): 7.0}
    assert a.requested_gpus == 2 and b.arrival_s == 30.0 and b.requested_gpus == 1


def test_profiles_written_as_csv_read_back_as_the_same_jobs():
    text = ("job,epochs,gpus,epoch_seconds,nodes,arrival_s,requested_gpus\n"
            "a,10,1,10.1,,0,2\na,10,2,6,1,,\na,10,2,7.3,2,,\nb,5,1,8,,30.5,\nb,5,2,5,,30.5,\n")
    jobs = profiles.parse_csv(text)
    assert profiles.parse_csv(profiles.to_csv(jobs)) == jobs


@pytest.mark.parametrize("bad,needle", [
    ("a,1,2,5,3,,\n", "nodes 3"),
    ("a,1,1,5,,-4,\n", "arrival_s"),
    ("a,1,1,5,,,0\n", "requested_gpus"),
])
def test_bad_optional_columns_are_refused_naming_the_value(bad, needle):
    with pytest.raises(PlanningError, match=needle):
        profiles.parse_csv("job,epochs,gpus,epoch_seconds,nodes,arrival_s,requested_gpus\n" + bad)


def test_simulate_charges_the_resize_cost_and_refuses_a_negative_one(capsys, tmp_path):
    import json

    from core_builders import PROFILES_CSV
    from omru.cli.main import main

    args = ["simulate", "--profiles", str(PROFILES_CSV), "--task", "image", "--gpus", "8", "--json"]
    assert main(args + ["--policy", "omru-ga", "--resize-cost", "0"]) == 0
    free = json.loads(capsys.readouterr().out)
    assert main(args + ["--policy", "omru-ga", "--resize-cost", "600"]) == 0
    charged = json.loads(capsys.readouterr().out)
    assert charged["makespan_s"] > free["makespan_s"]  # its reuse segments restart on new GPUs
    assert main(args + ["--policy", "omru", "--resize-cost", "-1"]) == 2
    assert "resize cost must be >= 0 seconds, got -1" in capsys.readouterr().err
