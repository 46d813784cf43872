"""The dispatcher's pure decisions: who starts or grows now, on which GPUs."""

from __future__ import annotations

import itertools

import pytest

from services.planner.dispatcher import JobView, corrected_profile, decide, epoch_table, observe

N0 = [("n0", 0), ("n0", 1)]
N1 = [("n1", 0), ("n1", 1)]
GPUS = N0 + N1


def waiting(j, remaining=5, **kw):
    return JobView(j, "WAITING", (), remaining, **kw)


def running(j, gpus, remaining=5, **kw):
    return JobView(j, "RUNNING", tuple(gpus), remaining, **kw)


def test_waiting_jobs_start_with_their_planned_counts_on_one_node_each():
    acts = decide([waiting("a"), waiting("b")], GPUS, {"a": 2, "b": 2}, ["a", "b"])
    assert {a.job_id: (a.kind, len({g[0] for g in a.gpus}), len(a.gpus)) for a in acts} == {
        "a": ("start", 1, 2), "b": ("start", 1, 2)}


def test_released_gpus_grow_a_running_job_when_the_gain_beats_the_restart():
    fast = {1: 10.0, 2: 5.5, 3: 4.0, 4: 3.2}
    acts = decide([running("b", N0[:1], remaining=6, epoch_s=fast)], GPUS[:2], {"b": 2}, ["b"], overhead_s=4.0)
    assert [(a.job_id, a.kind, a.gpus) for a in acts] == [("b", "resize", (("n0", 0), ("n0", 1)))]


def test_no_grow_when_the_restart_costs_more_than_it_saves():
    flat = {1: 10.0, 2: 9.5}
    assert decide([running("b", N0[:1], remaining=3, epoch_s=flat)], N0, {"b": 2}, ["b"], overhead_s=4.0) == []


def test_a_job_in_transition_keeps_its_gpus_and_a_waiting_job_takes_the_rest():
    moving = JobView("m", "RESIZING", tuple(N0 + N1[:1]), 4)
    acts = decide([moving, waiting("w")], GPUS, {"w": 4}, ["m", "w"])
    assert [(a.job_id, a.gpus) for a in acts] == [("w", (("n1", 1),))]


def test_gpus_left_free_start_waiting_jobs_not_planned_now_then_grow_running_ones():
    acts = decide([running("r", N0), waiting("later")], N0 + N1, {"r": 2}, ["r", "later"])
    assert [(a.job_id, a.kind, len(a.gpus)) for a in acts] == [("later", "start", 1), ("r", "resize", 3)]


@pytest.mark.parametrize("nodes,per", [(1, 2), (2, 2), (3, 1), (2, 3)])
def test_no_gpu_is_ever_given_twice_over_cluster_shapes(nodes, per):
    gpus = [(f"n{n}", i) for n in range(nodes) for i in range(per)]
    for k, counts in enumerate(itertools.product([0, 1, 2, 4], repeat=3)):
        held = gpus[: k % 2]
        jobs = [running("r", held)] if held else []
        jobs += [waiting(f"w{i}") for i in range(3)]
        acts = decide(jobs, gpus, {f"w{i}": c for i, c in enumerate(counts)} | {"r": 3}, [j.job_id for j in jobs])
        given = [g for a in acts for g in a.gpus if not (a.kind == "resize" and g in held)] + list(held)
        assert len(given) == len(set(given)) and set(given) <= set(gpus)


def test_the_epoch_table_covers_every_count_without_inventing_speed_up():
    t = epoch_table({1: 10.0, 2: 6.0}, gpus=4, max_gpus=3)
    assert t[1] == 10.0 and t[2] == 6.0 and t[3] == 6.0 and t[4] > t[3]
    assert epoch_table({2: 6.0}, gpus=2)[1] == 12.0
    assert epoch_table({1: 5.0, 2: 3.0}, gpus=2, min_gpus=2)[1] == 500.0


def test_observed_epochs_fold_into_a_running_mean_per_gpu_count():
    seen = observe({}, 2, 10.0)
    seen = observe(seen, 2, 14.0)
    seen = observe(seen, 1, 30.0)
    assert seen == {2: [12.0, 2], 1: [30.0, 1]}


def test_the_profile_follows_what_the_cluster_measured():
    profile = {1: 20.0, 2: 10.0, 4: 6.0}
    assert corrected_profile(profile, {}) == profile
    # seen at 2 GPUs 50 % slower than profiled: 2 takes the measured time, the others scale by it
    assert corrected_profile(profile, {2: [15.0, 3]}) == {1: 30.0, 2: 15.0, 4: 9.0}
    # two counts seen: each keeps its measurement, the rest scale by the mean ratio (1.5 and 1.0)
    assert corrected_profile(profile, {1: [30.0, 1], 2: [10.0, 4]}) == {1: 30.0, 2: 10.0, 4: 7.5}


def test_observed_epoch_times_survive_the_etcd_record():
    from services.planner.state import JobRecord

    r = JobRecord(spec={"job_id": "j", "epochs": 3}, profile={1: 20.0, 2: 10.0}, observed=observe({}, 2, 12.5))
    back = JobRecord.from_json(r.to_json())
    assert back == r and back.observed == {2: [12.5, 1]}


def test_a_running_job_shrinks_when_the_plan_gives_its_gpus_to_a_job_it_starts_now():
    jobs = [running("long", GPUS, remaining=10), waiting("a"), waiting("b")]
    acts = decide(jobs, GPUS, {"long": 2, "a": 1, "b": 1}, ["long", "a", "b"])
    assert [(a.job_id, a.kind, len(a.gpus)) for a in acts] == [("long", "resize", 2)]
    assert len({g[0] for g in acts[0].gpus}) == 1  # it keeps one node's GPUs
    # no shrink when nobody the plan starts now needs the GPUs, or for a job about to end
    assert decide([running("long", GPUS, remaining=10), waiting("a")], GPUS, {"long": 2}, ["long", "a"]) == []
    assert decide([running("long", GPUS, remaining=1), waiting("a")], GPUS, {"long": 2, "a": 2}, ["long", "a"]) == []
