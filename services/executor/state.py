"""States of a job on one executor, and the transitions between them.

One executor sees only the ranks of a job that live on its node; these states
describe that local part. The planner's view (`omru.v1.JobState`) is coarser;
`services.executor.convert.job_state` maps one onto the other.

    STARTING    worker processes of an attempt launched, not all reported
                "started" yet (rendezvous, model build, checkpoint load)
    RUNNING     every local rank trains (or profiles)
    RESIZING    asked to move to another GPU set: the workers finish the
                current epoch, checkpoint and exit; then the job starts on the
                new set (STARTING) or, when no new rank lives here, is STOPPED
    RESTARTING  a worker died: the others were stopped; the job restarts from
                the last checkpoint (STARTING) or gives up (FAILED) when it
                has used up max_restarts
    STOPPING    asked to stop: the workers finish the current epoch,
                checkpoint and exit
    STOPPED     no rank of the job runs here any more and its GPUs here are
                released; the job may go on elsewhere or later (a START or
                RESIZE naming this node brings it back: STARTING)
    FINISHED    every epoch trained (or the profiling trial measured); GPUs
                released
    FAILED      gave up (restarts used up, or a worker could not start); GPUs
                released

Transitions (anything else is a bug and raises `TransitionError`):

    STARTING   -> RUNNING | RESIZING | STOPPING | RESTARTING | STOPPED | FINISHED | FAILED
    RUNNING    -> RESIZING | STOPPING | RESTARTING | STOPPED | FINISHED | FAILED
    RESIZING   -> STARTING | STOPPING | STOPPED | FINISHED | FAILED
    RESTARTING -> STARTING | STOPPING | STOPPED | FAILED
    STOPPING   -> RESIZING | STOPPED | FINISHED | FAILED
    STOPPED    -> STARTING
    FINISHED   -> STARTING
    FAILED     -> STARTING

STARTING/RUNNING -> STOPPED happens when a peer node asked the job to stop
(the stop request is all-reduced over every rank) and the local ranks exited
cleanly before this node got its own directive. STOPPING -> RESIZING: the
job was started again here (or resized) before its stop drained, as when a
peer node was lost: it moves to the new GPU set once its ranks stopped. A terminal state goes back
to STARTING only through a new START (or RESIZE) directive.
"""

from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    """Where a job's local ranks stand on one executor."""

    STARTING = "starting"
    RUNNING = "running"
    RESIZING = "resizing"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def active(self) -> bool:
        """True while worker processes of the job may run here."""
        return self not in _AT_REST

    def __str__(self) -> str:
        return self.value


_AT_REST = frozenset({JobState.STOPPED, JobState.FINISHED, JobState.FAILED})

S = JobState
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.STARTING: frozenset({S.RUNNING, S.RESIZING, S.STOPPING, S.RESTARTING, S.STOPPED, S.FINISHED, S.FAILED}),
    S.RUNNING: frozenset({S.RESIZING, S.STOPPING, S.RESTARTING, S.STOPPED, S.FINISHED, S.FAILED}),
    S.RESIZING: frozenset({S.STARTING, S.STOPPING, S.STOPPED, S.FINISHED, S.FAILED}),
    S.RESTARTING: frozenset({S.STARTING, S.STOPPING, S.STOPPED, S.FAILED}),
    S.STOPPING: frozenset({S.RESIZING, S.STOPPED, S.FINISHED, S.FAILED}),
    S.STOPPED: frozenset({S.STARTING}),
    S.FINISHED: frozenset({S.STARTING}),
    S.FAILED: frozenset({S.STARTING}),
}
del S


class TransitionError(RuntimeError):
    """A state change that the table above does not allow."""


def can_move(old: JobState, new: JobState) -> bool:
    """True when old -> new is an allowed transition."""
    return new in TRANSITIONS[old]


def check_move(old: JobState, new: JobState) -> JobState:
    """new, when old -> new is allowed; else TransitionError naming both."""
    if not can_move(old, new):
        raise TransitionError(f"job state {old} cannot move to {new}")
    return new
