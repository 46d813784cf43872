"""Job state transitions (pure): which moves between job states are allowed.

States are the names of omru.v1.JobState without the prefix. Staying in the
same state is always allowed (progress updates); terminal states allow
nothing else.
"""

from __future__ import annotations

TERMINAL = frozenset({"FINISHED", "FAILED", "CANCELLED"})
_ENDINGS = {"FAILED", "CANCELLED"}

#: state -> states it may move to (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "PENDING": frozenset({"PROFILING", "WAITING", *_ENDINGS}),
    "PROFILING": frozenset({"WAITING", "PENDING", *_ENDINGS}),
    "WAITING": frozenset({"STARTING", "PROFILING", *_ENDINGS}),
    "STARTING": frozenset({"RUNNING", "WAITING", "FINISHED", *_ENDINGS}),
    "RUNNING": frozenset({"RESIZING", "WAITING", "FINISHED", *_ENDINGS}),
    "RESIZING": frozenset({"STARTING", "RUNNING", "WAITING", "FINISHED", *_ENDINGS}),
    "FINISHED": frozenset(),
    "FAILED": frozenset(),
    "CANCELLED": frozenset(),
}


def can_move(current: str, new: str) -> bool:
    """True when a job in `current` may move to `new`."""
    if new not in ALLOWED or current not in ALLOWED:
        return False
    return new == current and current not in TERMINAL or new in ALLOWED[current]
