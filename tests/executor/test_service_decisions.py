"""The executor's pure parts: what it decides when an attempt's workers exit,
which state changes it allows, and how directives convert (no processes)."""

from __future__ import annotations

import pytest

from omru.v1 import common_pb2, executor_pb2
from services.executor import convert
from services.executor.state import TRANSITIONS, JobState, TransitionError, check_move
from services.executor.supervisor import Action, DirectiveError, Gpu, decide
from tests.executor.service_builders import RESIZE, START, directive, gpu, tiny_job

S = JobState


def _decide(state=S.RUNNING, outcome="failed", all_done=False, restarts=0, max_restarts=2, new_local=False, profiling=False):
    return decide(state, outcome, all_done, restarts, max_restarts, new_local, profiling)


@pytest.mark.parametrize("state", [S.STARTING, S.RUNNING, S.RESIZING, S.STOPPING])
def test_an_attempt_that_trained_every_epoch_finishes_whatever_was_asked(state):
    assert _decide(state, "finished") is Action.FINISH
    assert _decide(state, "exited", all_done=True) is Action.FINISH  # a node without rank 0


def test_a_failed_worker_restarts_until_max_restarts_then_the_job_fails():
    assert [_decide(restarts=n, max_restarts=2) for n in range(4)] == [Action.RESTART, Action.RESTART, Action.FAIL, Action.FAIL]
    assert _decide(max_restarts=0) is Action.FAIL


def test_a_failed_profiling_trial_fails_at_once_and_a_finished_one_finishes():
    assert _decide(profiling=True) is Action.FAIL
    assert _decide(outcome="profiled", profiling=True) is Action.FINISH
    assert _decide(outcome="exited", profiling=True) is Action.FINISH


def test_a_resize_moves_the_job_when_it_keeps_ranks_here_and_stops_it_here_otherwise():
    assert _decide(S.RESIZING, "stopped", new_local=True) is Action.MOVE
    assert _decide(S.RESIZING, "stopped", new_local=False) is Action.STOP
    assert _decide(S.RESIZING, "exited", new_local=True) is Action.MOVE  # rank 0 elsewhere stopped
    assert _decide(S.RESIZING, "failed", new_local=True) is Action.MOVE  # from the last checkpoint anyway


def test_ranks_stopped_by_a_peer_or_while_stopping_end_stopped_not_failed():
    assert _decide(S.RUNNING, "exited") is Action.STOP
    assert _decide(S.RUNNING, "stopped") is Action.STOP
    assert _decide(S.STOPPING, "failed") is Action.STOP
    assert _decide(S.STOPPING, "terminated") is Action.STOP


def test_only_the_documented_state_changes_are_allowed():
    for old in S:
        for new in S:
            if new in TRANSITIONS[old]:
                assert check_move(old, new) is new
            else:
                with pytest.raises(TransitionError, match=f"{old} cannot move to {new}"):
                    check_move(old, new)
    assert [s for s in S if not s.active] == [S.STOPPED, S.FINISHED, S.FAILED]
    assert all(TRANSITIONS[s] == {S.STARTING} for s in S if not s.active)


def test_every_executor_state_maps_to_a_planner_job_state():
    assert {s: convert.job_state(s) for s in S}[S.STOPPED] == common_pb2.JOB_STATE_WAITING
    assert all(convert.job_state(s) != common_pb2.JOB_STATE_UNSPECIFIED for s in S)
    assert convert.job_state(S.RUNNING, profiling=True) == common_pb2.JOB_STATE_PROFILING


def test_a_directive_converts_with_the_proto_zero_defaults():
    d = convert.directive(directive("d1", START, tiny_job("j", base_batch=0, image_size=0, min_gpus=0, max_gpus=0),
                                    [gpu("n1", 0), gpu("n2", 3)], attempt_id="a1"))
    assert (d.job_id, d.gpus, d.attempt_id, d.profile) == ("j", (Gpu("n1", 0), Gpu("n2", 3)), "a1", None)
    assert (d.spec.base_batch, d.spec.image_size, d.spec.min_gpus) == (8, 32, 1) and d.spec.max_gpus >= 1024
    p = convert.directive(directive("d2", RESIZE, tiny_job("j"), [gpu("n1", 0)],
                                    profile=executor_pb2.ProfileOptions(warmup_iters=0, full_epoch=True)))
    assert (p.profile.mode, p.profile.warmup_iters) == ("epoch", 0)


@pytest.mark.parametrize("d, field", [
    (directive("d", START, tiny_job("j"), [gpu("n1", 0), gpu("n1", 0)]), "directive.gpus[1]"),
    (directive("d", START, tiny_job("j"), [gpu("n1", -1)]), "directive.gpus[0].index"),
    (directive("d", START, tiny_job("j", epochs=0), [gpu("n1", 0)]), "directive.job.epochs"),
    (directive("d", START, tiny_job("j", base_lr=0), [gpu("n1", 0)]), "directive.job.base_lr"),
    (directive("d", START, tiny_job("j", model="r3d_18"), [gpu("n1", 0)]), "directive.job.frames"),
    (directive("d", START, tiny_job("bad id!"), [gpu("n1", 0)]), "directive.job.job_id"),
    (directive("d", START, tiny_job("j"), [gpu("n1", 0)], rendezvous_endpoint="nohost"), "directive.rendezvous_endpoint"),
    (directive("d", START, tiny_job("j"), [gpu("n1", 0)], attempt_id="-x"), "directive.attempt_id"),
    (directive("d", executor_pb2.DIRECTIVE_KIND_STOP, tiny_job("j"), [gpu("n1", 0)]), "directive.kind"),
    (directive("d", 0, tiny_job("j"), [gpu("n1", 0)]), "directive.kind"),
    (directive("", START, tiny_job("j"), [gpu("n1", 0)]), "directive.directive_id"),
    (directive("d", START, tiny_job("j"), []), "directive.gpus"),
])
def test_a_bad_directive_is_refused_naming_its_field(d, field):
    with pytest.raises(DirectiveError) as err:
        convert.directive(d)
    assert err.value.field == field
