"""The planner's pure decisions: which planned steps begin now, on which GPUs; epoch tables."""

from __future__ import annotations

import random

import pytest

from services.planner.dispatcher import departs
from services.planner.learn import epoch_table, observe, settled, timing
from services.planner.follow import Live, Step, blockers, follow, late

N0 = [("n0", 0), ("n0", 1)]
N1 = [("n1", 0), ("n1", 1)]
GPUS = N0 + N1


def waiting(j, done=0):
    return Live(j, True, False, (), done)


def running(j, gpus, done=0, moving=False):
    return Live(j, False, moving, tuple(gpus), done)


def live(*jobs):
    return {j.job_id: j for j in jobs}


def moves(steps, jobs, gpus=GPUS, park=None):
    return [(m.job_id, m.kind, m.gpus) for m in follow(steps, live(*jobs), gpus, park)]


def test_a_waiting_job_starts_on_exactly_its_planned_gpus_when_they_are_free():
    steps = [Step("a", (N1[1], N0[0]), 0, 0.0, 5)]
    assert moves(steps, [waiting("a")]) == [("a", "start", (N1[1], N0[0]))]
    # one of them held by a job the plan does not know: it waits
    assert moves(steps, [waiting("a"), running("x", [N0[0]])]) == []


def test_gpus_are_handed_over_in_the_planned_order_when_the_holder_really_releases_them():
    # a runs on n0 until it ends; b is planned there after it, c after b
    steps = [Step("b", tuple(N0), 0, 100.0, 3), Step("c", tuple(N0), 0, 200.0, 3)]
    assert moves(steps, [running("a", N0, done=4), waiting("b"), waiting("c")]) == []
    # a ended (early or late): b takes n0, and c, planned later, does not jump the queue
    assert moves(steps, [waiting("b"), waiting("c")]) == [("b", "start", tuple(N0))]
    # c is not planned on n1, so free n1 does not tempt it
    assert moves(steps, [running("b", N0), waiting("c")]) == []


def test_a_running_job_moves_in_the_last_epoch_before_its_next_step_and_only_onto_gpus_it_may_take():
    # a runs on n0 for 3 more epochs (it has done 2), then on all four GPUs
    steps = [Step("a", tuple(N0), 2, 0.0, 3), Step("a", tuple(GPUS), 5, 30.0, 4)]
    assert moves(steps, [running("a", N0, done=2)]) == []
    assert moves(steps, [running("a", N0, done=4)]) == [("a", "resize", tuple(GPUS))]
    # the GPUs it gains are still held by another job: it keeps running where it is
    assert moves(steps, [running("a", N0, done=4), running("x", N1[:1])]) == []
    # a move already under way is left alone
    assert moves(steps, [running("a", N0, done=4, moving=True)]) == []


def test_a_running_job_parks_for_gpus_still_held_only_when_the_planner_finds_it_worth_it():
    steps = [Step("a", tuple(N0), 2, 0.0, 3), Step("a", tuple(GPUS), 5, 30.0, 4), Step("y", tuple(N1), 0, 40.0, 1)]
    asked = []

    def park(j, s, holders):
        asked.append((j.job_id, s.after, holders))
        return True

    x = running("x", N1[:1])
    # in its last epoch before the step, the GPUs it gains held by x: it parks on all four, asked about x
    assert moves(steps, [running("a", N0, done=4), x], park=park) == [("a", "park", tuple(GPUS))]
    assert asked == [("a", 5, frozenset({"x"}))]
    assert moves(steps, [running("a", N0, done=4), x], park=lambda *_: False) == []
    # not in its last epoch yet, a move under way, or a waiting job: no park, nothing asked
    asked.clear()
    assert moves(steps, [running("a", N0, done=3), x], park=park) == []
    assert moves(steps, [running("a", N0, done=4, moving=True), x], park=park) == []
    assert moves([Step("b", tuple(GPUS), 0, 0.0, 2)], [waiting("b"), x], park=park) == []
    assert asked == []
    # a GPU it gains planned first for another job's step: it may not park there either
    first = [Step("a", tuple(N0), 2, 0.0, 3), Step("y", tuple(N1), 0, 10.0, 1), Step("a", tuple(GPUS), 5, 30.0, 4)]
    assert moves(first, [running("a", N0, done=4), waiting("y"), x], park=park) == []


def test_a_shrink_needs_no_free_gpu_and_frees_the_rest_for_the_next_in_line():
    steps = [Step("a", tuple(N0), 6, 40.0, 2), Step("b", tuple(N1), 0, 41.0, 5)]
    assert moves(steps, [running("a", GPUS, done=5), waiting("b")]) == [("a", "resize", tuple(N0))]
    # b waits for a to let n1 go
    assert moves(steps, [running("a", GPUS, done=3), waiting("b")]) == []


def test_steps_already_done_or_running_are_not_begun_again():
    steps = [Step("a", tuple(N0), 0, 0.0, 3), Step("a", tuple(GPUS), 3, 30.0, 2)]
    assert moves(steps, [running("a", GPUS, done=3)]) == []
    assert moves(steps, [running("a", GPUS, done=5)]) == []


def test_a_job_that_moved_is_not_moved_again_while_its_old_gpu_is_not_released_yet():
    # a moved from n0 onto n1 (its step); n0's executor has not reported the old attempt's release
    steps = [Step("a", tuple(N0), 0, 0.0, 2), Step("a", tuple(N1), 2, 20.0, 4)]
    moved = Live("a", False, False, tuple(N1 + N0), 2, runs_on=tuple(N1))
    assert moves(steps, [moved]) == []
    # the same job without knowing what it runs on would be sent onto n1 again (a needless restart)
    assert moves(steps, [Live("a", False, False, tuple(N1 + N0), 2)]) == [("a", "resize", tuple(N1))]


def test_a_late_step_says_what_blocks_it():
    steps = [Step("b", tuple(N0), 0, 100.0, 3), Step("c", (N0[1], N1[0]), 0, 50.0, 3)]
    jobs = live(running("a", N0[:1]), waiting("b"), waiting("c"))
    assert blockers(steps, jobs, steps[0]) == {"n0:0": "held by a (its plan ends there)",
                                               "n0:1": "c planned first (50.0 s)"}
    assert blockers(steps, jobs, steps[1]) == {}
    # a holder whose own next step (elsewhere) has not begun yet
    moving_on = [*steps, Step("a", N1[1:], 2, 40.0, 1)]
    assert blockers(moving_on, jobs, steps[0])["n0:0"] == "held by a (next step after 2 epochs, 0 done, planned 40.0 s)"


def test_a_step_is_late_when_its_planned_start_has_passed_and_a_gpu_it_needs_idles():
    steps = [Step("b", tuple(N0), 0, 100.0, 3)]
    # a, planned to end at 100 s, still runs at 200 s: b waits, but nothing idles
    assert late(steps, live(running("a", N0), waiting("b")), now_s=200.0, slack_s=10.0) == []
    # a let one GPU go; the other is still held: b is late and a GPU idles
    assert late(steps, live(running("a", N0[:1]), waiting("b")), now_s=200.0, slack_s=10.0) == steps
    # within the slack it is not late yet
    assert late(steps, live(running("a", N0[:1]), waiting("b")), now_s=105.0, slack_s=10.0) == []
    # b's start being written (a moving job takes its step): not late
    assert late(steps, live(Live("b", True, True, (), 0)), now_s=200.0, slack_s=10.0) == []


@pytest.mark.parametrize("parks", [False, True])
@pytest.mark.parametrize("nodes,per", [(1, 4), (2, 2), (3, 3)])
def test_no_gpu_is_ever_given_twice_over_random_plans_and_states(nodes, per, parks):
    gpus = [(f"n{n}", i) for n in range(nodes) for i in range(per)]
    rng = random.Random(nodes * 10 + per)
    for _ in range(300):
        steps, jobs, free = [], [], list(gpus)
        rng.shuffle(free)
        for k in range(rng.randint(1, 6)):
            name = f"j{k}"
            if free and rng.random() < 0.4:
                held = [free.pop() for _ in range(rng.randint(1, min(2, len(free))))]
                jobs.append(running(name, held, done=rng.randint(0, 4)))
            else:
                jobs.append(waiting(name))
            after = 0
            for _ in range(rng.randint(1, 3)):
                steps.append(Step(name, tuple(rng.sample(gpus, rng.randint(1, len(gpus)))), after,
                                  rng.uniform(0, 100), 2))
                after += 2
        acts = follow(steps, live(*jobs), gpus, (lambda *_: True) if parks else None)
        owner = {g: j.job_id for j in jobs for g in j.held}
        gained: dict = {}  # GPU -> the move of this pass that gains it
        for a in acts:
            for g in (g for g in a.gpus if owner.get(g) != a.job_id):
                assert g not in gained, (g, a, gained[g])  # no GPU goes to two jobs
                gained[g] = a
                # a start or resize takes only free GPUs; a parked job claims the others once released
                assert a.kind == "park" or g not in owner, (g, a, owner)
            if a.kind == "park":  # only a running job parks, for GPUs another job holds
                assert not live(*jobs)[a.job_id].waiting and any(g in owner and owner[g] != a.job_id for g in a.gpus)
        assert len({a.job_id for a in acts}) == len(acts)


def test_the_epoch_table_covers_every_count_without_inventing_speed_up():
    t = epoch_table({1: 10.0, 2: 6.0}, gpus=4, max_gpus=3)
    assert t[1] == 10.0 and t[2] == 6.0 and t[3] == 6.0 and t[4] > t[3]
    assert epoch_table({2: 6.0}, gpus=2)[1] == 12.0
    assert epoch_table({1: 5.0, 2: 3.0}, gpus=2, min_gpus=2)[1] == 500.0


def seen(*seconds: float, gpus: int = 2, nodes: int = 1, observed=None) -> dict:
    for t in seconds:
        observed = observe(observed or {}, (gpus, nodes), t)
    return observed


def test_observed_epochs_fold_into_running_statistics_per_placement():
    s = seen(30.0, gpus=1, observed=seen(10.0, 14.0))
    assert s == {(2, 1): [12.0, 2, 8.0], (1, 1): [30.0, 1, 0.0]}  # mean, epochs, sum of squared deviations


def test_only_a_mean_that_settled_away_from_the_expected_time_counts():
    assert settled(seen(12.0, 12.0, 12.0)[2, 1], 10.0) == 12.0  # three steady epochs, 20 % off
    assert settled(seen(12.0, 12.0)[2, 1], 10.0) is None  # two epochs say nothing yet
    # noisy epochs whose mean is off by less than 3 standard errors: noise, not a slower job
    noisy = seen(9.0, 13.0, 10.0, 14.0)[2, 1]  # mean 11.5, standard error 1.19
    assert settled(noisy, 10.0) is None
    # 3.8 standard errors off, but a spread taken from four epochs is itself a guess: Student's t with
    # 3 degrees of freedom needs 9.2 (four epochs of a job whose times vary by 10 % are 13 % fast often)
    assert settled(noisy, 7.0) is None
    assert settled(seen(50.0, 54.0, 48.0, 44.0)[2, 1], 56.5) is None
    many = seen(*[9.0, 13.0, 10.0, 14.0] * 3)[2, 1]  # twelve epochs: mean 11.5, standard error 0.62
    assert settled(many, 7.0) == 11.5  # 7.2 standard errors off, beyond t's 3.7 at 11 degrees
    assert settled(many, 10.0) is None  # 2.4
    assert settled([12.0, 5], 10.0) == 12.0  # a record stored before the spread was kept: no spread


def test_a_job_departs_from_the_plan_only_when_it_moves_its_end_by_more_than_the_slack():
    # a plan of 10,000 s: the slack is 5 % of it, 500 s
    slow = seen(120.0, 120.0, 120.0)[2, 1]
    assert departs(100.0, slow, 50, 10_000.0)  # 20 % slow over 50 more epochs: 1,000 s later
    assert not departs(100.0, slow, 20, 10_000.0)  # the same, 20 epochs left: 400 s, within the slack
    assert not departs(10.0, seen(12.0, 12.0, 12.0)[2, 1], 200, 10_000.0)  # many short epochs, 20 % off: 400 s
    assert departs(100.0, seen(70.0, 70.0, 70.0)[2, 1], 50, 10_000.0)  # faster counts too: 1,500 s earlier
    assert not departs(100.0, seen(109.0, 109.0, 109.0)[2, 1], 1_000, 10_000.0)  # within REPLAN_DEVIATION
    assert not departs(100.0, seen(200.0, 200.0)[2, 1], 1_000, 10_000.0)  # two epochs are no mean yet
    assert not departs(100.0, seen(60.0, 180.0, 90.0)[2, 1], 1_000, 10_000.0)  # mean 110, but noise


def test_the_epoch_times_planned_follow_what_the_cluster_measured_per_placement():
    from services.planner.core.model import Cluster
    from services.planner.state import JobRecord

    cluster = Cluster.of(4, 2)  # 2 nodes of 2

    def planned(observed, placement=()):
        r = JobRecord(spec={"job_id": "j", "epochs": 9}, profile={1: 20.0, 2: 10.0, 4: 6.0},
                      placement=placement, observed=observed)
        t = timing(r, cluster)
        return [t.epoch_seconds(g, k) for g, k in ((1, 1), (2, 1), (2, 2), (3, 2), (4, 2))]

    assert planned({}) == [20.0, 10.0, 10.0, 10.0, 6.0]
    # seen on 2 GPUs of one node 50 % slower than profiled: it takes the measured time, the others scale
    assert planned(seen(15.0, 15.0, 15.0)) == [30.0, 15.0, 15.0, 15.0, 9.0]
    # seen on 2 GPUs over 2 nodes, 3 times the profile's: that spread alone takes it (one node stays at
    # 10 s), the others scale by the ratio
    assert planned(seen(30.0, 30.0, 30.0, nodes=2)) == [60.0, 30.0, 30.0, 30.0, 18.0]
    both = seen(30.0, 30.0, 30.0, nodes=2, observed=seen(5.0, 5.0, 5.0))  # 2 GPUs twice as fast on one node
    assert planned(both) == [35.0, 5.0, 30.0, 17.5, 10.5]  # the ratio (3 + 0.5) / 2 where it was not seen
    # a measured spread it confirms stays; one it contradicts moves
    assert planned(seen(20.0, 20.0, 20.0, nodes=2), placement=((2, 2, 20.0),))[2] == 20.0
    assert planned(seen(40.0, 40.0, 40.0, nodes=2), placement=((2, 2, 20.0),))[2] == 40.0
    # epochs as noisy as they are off, or too few, leave the profile as it is
    assert planned(seen(8.0, 13.0, 11.0)) == planned({})
    assert planned(seen(15.0)) == planned({})
    # a count the profile skips is judged against the time planned for it (the count below's)
    assert planned(seen(12.0, 12.0, 12.0, gpus=3, nodes=2))[3] == 12.0


def test_observed_epoch_times_survive_the_etcd_record():
    from services.planner.state import JobRecord

    r = JobRecord(spec={"job_id": "j", "epochs": 3}, profile={1: 20.0, 2: 10.0}, observed=observe({}, (2, 1), 12.5))
    back = JobRecord.from_json(r.to_json())
    assert back == r and back.observed == {(2, 1): [12.5, 1, 0.0]}
    # a record stored before placements were kept reads its counts as on one node
    assert JobRecord.from_json(b'{"spec": {}, "observed": {"2": [12.5, 1]}}').observed == {(2, 1): [12.5, 1]}



def test_a_job_that_ended_while_its_gpus_are_released_one_node_at_a_time_is_neither_late_nor_moved():
    steps = [Step("a", tuple(GPUS), 0, 0.0, 1), Step("b", tuple(N1), 0, 50.0, 2)]
    # a finished; n0's executor released its half, n1's not yet: nothing of a is pending, b waits for n1
    ended = Live("a", True, True, tuple(N1), 0, ended=True)
    assert late(steps, live(ended, waiting("b")), now_s=40.0, slack_s=10.0) == []
    assert moves(steps, [ended, waiting("b")]) == []
