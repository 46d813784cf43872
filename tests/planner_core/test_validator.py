"""The validator rejects every broken rule, naming what is wrong."""

from __future__ import annotations

import pytest

from core_builders import job, problem
from services.planner.core import validate
from services.planner.core.model import Job, Plan, Segment, Unplaced

P = problem([job("a", 2, 10.0, 6.0), job("b", 1, 8.0, 5.0)], gpus=2)


def plan(*segments, **kw) -> Plan:
    return Plan("test", tuple(Segment(*s) for s in segments), **kw)


GOOD = (("a", 0.0, 12.0, (0, 1), 2), ("b", 12.0, 20.0, (0,), 1))


def test_a_plan_that_keeps_every_rule_passes():
    assert validate.violations(plan(*GOOD), P) == []
    validate.check(plan(*GOOD), P)


@pytest.mark.parametrize(
    "segments, expected",
    [
        ((("a", 0.0, 12.0, (0, 1), 2), ("b", 11.0, 19.0, (0,), 1)), "GPU 0"),
        ((("a", 0.0, 10.0, (0,), 1), ("a", 5.0, 15.0, (1,), 1), ("b", 20.0, 28.0, (0,), 1)), "job a"),
        ((("a", 0.0, 6.0, (0, 1), 1), ("b", 12.0, 20.0, (0,), 1)), "1 epochs planned, needs 2"),
        ((("a", 0.0, 11.9, (0, 1), 2), ("b", 12.0, 20.0, (0,), 1)), "need 12"),
        ((("a", 0.0, 12.0, (0, 2), 2), ("b", 12.0, 20.0, (0,), 1)), "outside 0..1"),
        ((("a", 0.0, 12.0, (1, 1), 2), ("b", 12.0, 20.0, (0,), 1)), "listed twice"),
        ((("a", -1.0, 11.0, (0, 1), 2), ("b", 12.0, 20.0, (0,), 1)), "before 0"),
        (GOOD + (("c", 20.0, 21.0, (0,), 1),), "unknown job"),
        ((("a", 0.0, 12.0, (0, 1), 2), ("b", 12.0, 12.0, (0,), 0)), "0 epochs"),
    ],
    ids=["gpu-overlap", "job-overlap", "missing-epochs", "too-short", "bad-gpu-id", "gpu-twice",
         "negative-start", "unknown-job", "zero-epochs"],
)
def test_a_plan_that_breaks_a_rule_is_rejected_with_the_rule_named(segments, expected):
    found = validate.violations(plan(*segments), P)
    assert any(expected in v for v in found), found
    with pytest.raises(validate.InvalidPlan):
        validate.check(plan(*segments), P)


def test_no_segment_may_start_before_its_job_arrives():
    late = problem([Job("a", 1, {1: 4.0, 2: 3.0}, arrival_s=10.0)], gpus=2)
    assert any("arrival" in v for v in validate.violations(plan(("a", 5.0, 9.0, (0,), 1)), late))
    assert validate.violations(plan(("a", 10.0, 14.0, (0,), 1)), late) == []


def test_segments_spread_over_nodes_are_charged_the_placement_time():
    spread = Job("a", 1, {1: 4.0, 2: 2.0}, placement={(2, 2): 3.0})
    p = problem([spread], gpus=2, gpus_per_node=1)
    assert any("need 3" in v for v in validate.violations(plan(("a", 0.0, 2.0, (0, 1), 1)), p))
    assert validate.violations(plan(("a", 0.0, 3.0, (0, 1), 1)), p) == []


def test_a_spread_the_table_does_not_give_costs_the_slowest_measured_over_fewer_nodes():
    # 4 GPUs measured on 1 node (the profile), over 2 and 3 nodes; not over 4
    j = Job("a", 1, {1: 40.0, 2: 20.0, 3: 14.0, 4: 10.0}, placement={(4, 2): 30.0, (4, 3): 20.0})
    assert [j.epoch_seconds(4, k) for k in (1, 2, 3, 4)] == [10.0, 30.0, 20.0, 30.0]
    assert Job("b", 1, {4: 10.0}, placement={(4, 3): 20.0}).epoch_seconds(4, 2) == 10.0  # nothing slower measured
    # the validator charges the same: a 4-node segment timed at the profile's 10 s is refused
    p = problem([j], gpus=4, gpus_per_node=1)
    assert any("need 30" in v for v in validate.violations(plan(("a", 0.0, 10.0, (0, 1, 2, 3), 1)), p))
    assert validate.violations(plan(("a", 0.0, 30.0, (0, 1, 2, 3), 1)), p) == []


def test_a_job_listed_as_unplaced_must_have_no_epochs_and_others_still_all_theirs():
    only_b = plan(("b", 0.0, 8.0, (0,), 1), unplaced=(Unplaced("a", "no room"),))
    assert validate.violations(only_b, P) == []
    assert validate.violations(plan(("b", 0.0, 8.0, (0,), 1)), P) != []
