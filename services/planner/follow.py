"""Following a plan as it really happens: which planned steps may begin now. Pure.

A plan is a list of `Step`s: a job on exactly these GPUs, from the moment its
job has `after` epochs done (the epochs of its earlier steps and of what it
already ran), in planned start order. The cluster does not keep the plan's
clock (jobs end early or late), so steps are taken when what precedes them
has really happened, as Kubernetes' kubelet follows bindings and AdaptDL's
jobs follow their allocations:

- each GPU is handed over in the planned order: a step may take a GPU only
  when no step planned to start earlier on it is still pending, and nobody
  else holds it;
- a waiting job starts its next step on its planned GPUs once all of them
  are its to take (B starts on the GPUs A releases, when A really releases
  them, early or late);
- a running job moves to its next step (resize: the executor moves it at its
  next epoch boundary) once it is in the last epoch before the step and the
  GPUs it gains are its to take; until then it keeps what it holds;
- unless those GPUs' holders are late, and waiting for them costs less than
  the epoch it would otherwise train on what it holds: then it parks (`park`,
  the planner's call): it stops at that boundary, keeps its GPUs, and takes
  the others as their holders release them (a 4-GPU job growing onto 64 GPUs
  whose last holder ends a little after that boundary would else leave 60 GPUs
  idle for a whole 4-GPU epoch).

`follow` returns the moves for now; `late` the steps reality has fallen
behind while GPUs idle, on which the planner replans (see dispatcher.py),
giving the core what runs as committed history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

Gpu = tuple[str, int]


@dataclass(frozen=True)
class Step:
    """Job `job_id` on `gpus` from when it has `after` epochs done; `start_s`: planned start (plan seconds)."""

    job_id: str
    gpus: tuple[Gpu, ...]
    after: int
    start_s: float
    epochs: int


@dataclass(frozen=True)
class Live:
    """What `follow` needs of one job now: `held` its GPUs (running, or reserved by a directive)."""

    job_id: str
    waiting: bool  # no attempt runs or is starting
    moving: bool  # a directive is in flight (starting or resizing): touch nothing of it
    held: tuple[Gpu, ...]
    epochs_done: int
    #: the GPUs its attempt runs on (or moves to); None: all it holds. A job that still holds a GPU its
    #: last attempt used (not released yet) holds more than it runs on.
    runs_on: tuple[Gpu, ...] | None = None
    #: it ended (or is not the planner's) but some of its GPUs are not released yet: it has nothing to begin
    ended: bool = False

    @property
    def on(self) -> tuple[Gpu, ...]:
        return self.held if self.runs_on is None else self.runs_on


@dataclass(frozen=True)
class Move:
    """Start (a waiting job), resize or park (a running one) `job_id` onto exactly `gpus`; `step` is the plan's."""

    job_id: str
    kind: str  # "start" | "resize" | "park" (resize at the next epoch boundary onto GPUs some of which others hold)
    gpus: tuple[Gpu, ...]
    step: Step


def pending(steps: Sequence[Step], live: Mapping[str, Live]) -> dict[str, list[Step]]:
    """Per job, its steps not yet begun, in order. A step has begun when the job holds its GPUs and
    has reached it (a running job's steps on the GPUs it holds continue what runs)."""
    out: dict[str, list[Step]] = {}
    for s in sorted(steps, key=lambda s: (s.after, s.start_s)):
        j = live.get(s.job_id)
        if j is None or j.ended:
            continue
        rest = out.setdefault(s.job_id, [])
        if not rest and not j.waiting and set(s.gpus) == set(j.on):
            continue  # what runs now
        if not rest and j.epochs_done >= s.after + s.epochs:
            continue  # already done
        rest.append(s)
    return {job: rest for job, rest in out.items() if rest}


def late(steps: Sequence[Step], live: Mapping[str, Live], now_s: float, slack_s: float) -> list[Step]:
    """Pending steps planned to begin more than slack_s before now_s (plan seconds) that leave a GPU
    idle meanwhile: reality has fallen behind the plan, and the plan is stale. A job that is moving
    (its move being written, or under way) is not behind: it is taking its step."""
    held = {g for j in live.values() for g in j.held}
    return [s for job, rest in pending(steps, live).items() if not live[job].moving for s in rest
            if s.start_s + slack_s < now_s and any(g not in held for g in s.gpus)]


def _holders(live: Mapping[str, Live]) -> dict[Gpu, str]:
    """GPU -> the job that holds it."""
    return {g: j.job_id for j in live.values() for g in j.held}


def _heads(todo: Mapping[str, list[Step]]) -> dict[Gpu, Step]:
    """GPU -> the first pending step on it, in planned order."""
    head: dict[Gpu, Step] = {}
    for rest in todo.values():
        for s in rest:
            for g in s.gpus:
                if g not in head or (s.start_s, s.job_id) < (head[g].start_s, head[g].job_id):
                    head[g] = s
    return head


def blockers(steps: Sequence[Step], live: Mapping[str, Live], step: Step) -> dict[str, str]:
    """Why a pending step cannot begin: per GPU it gains, the job holding it or the step planned on it first."""
    todo = pending(steps, live)
    holder, head = _holders(live), _heads(todo)
    mine = live[step.job_id].held if step.job_id in live else ()
    out = {}
    for g in (g for g in step.gpus if g not in mine):
        first = head.get(g, step)
        if holder.get(g, step.job_id) != step.job_id:
            h = live[holder[g]]
            nxt = todo.get(h.job_id, [None])[0]
            # the holder runs past its plan's end there, or its own next step has not begun yet
            why = "(its plan ends there)" if nxt is None else (
                f"(next step after {nxt.after} epochs, {h.epochs_done} done, planned {nxt.start_s:.1f} s)")
            out[f"{g[0]}:{g[1]}"] = f"held by {holder[g]} {why}"
        elif first is not step:
            out[f"{g[0]}:{g[1]}"] = f"{first.job_id} planned first ({first.start_s:.1f} s)"
    return out


#: park(job, its step, the jobs holding GPUs it gains) -> whether it should stop and wait for them
Park = Callable[[Live, Step, frozenset[str]], bool]


def follow(steps: Sequence[Step], live: Mapping[str, Live], gpus: Sequence[Gpu], park: Park | None = None) -> list[Move]:
    """The moves that may happen now (see the module docstring). Never gives one GPU to two jobs: a
    parked job takes the GPUs others hold only as they release them."""
    todo = pending(steps, live)
    holder, head = _holders(live), _heads(todo)
    live_gpus = set(gpus)
    moves: list[Move] = []
    for job_id, rest in sorted(todo.items(), key=lambda kv: (kv[1][0].start_s, kv[0])):
        j, s = live[job_id], rest[0]
        if j.moving or not set(s.gpus) <= live_gpus:
            continue
        gained = [g for g in s.gpus if g not in j.held]
        if any(head.get(g) is not s for g in gained):
            continue
        held_by = frozenset(holder[g] for g in gained if holder.get(g, job_id) != job_id)
        if j.waiting:
            if held_by:
                continue
            kind = "start"
        elif j.epochs_done + 1 < s.after:
            continue
        elif not held_by:  # in the last epoch before the step: it moves at that boundary
            kind = "resize"
        elif park is not None and park(j, s, held_by):
            kind = "park"
        else:
            continue
        for g in s.gpus:
            holder[g] = job_id
        moves.append(Move(job_id, kind, s.gpus, s))
    return moves
