"""What omru.elastic shares with the executor's worker specs: `ProfileSpec` (a profiling trial, which a
script reads from OMRU_PROFILE) and `SpecError`, with the checks both use.

services/executor/worker/spec.py builds `TrainSpec` and `AttemptSpec` on
these; this module needs nothing of the services package.
"""

from __future__ import annotations

from dataclasses import dataclass


class SpecError(ValueError):
    """A spec value that is out of range; ``field`` names the offending field."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def require(cond: bool, field_name: str, message: str) -> None:
    """SpecError(field_name, message) unless cond."""
    if not cond:
        raise SpecError(field_name, message)


def int_field(obj, name: str, minimum: int) -> None:
    """SpecError unless obj.name is an integer (not a bool) >= minimum."""
    value = getattr(obj, name)
    require(isinstance(value, int) and not isinstance(value, bool), name, f"must be an integer, got {value!r}")
    require(value >= minimum, name, f"must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class ProfileSpec:
    """Profile instead of train: time iterations, report, exit (no checkpoints).

    ``mode="sampled"``: run ``warmup_iters`` iterations, then time
    ``measure_iters`` iterations and report their steady-state mean (and an epoch
    estimate). ``mode="epoch"``: after the warm-up iterations, time one full epoch.
    """

    mode: str = "sampled"
    warmup_iters: int = 3
    measure_iters: int = 10

    def __post_init__(self) -> None:
        require(self.mode in ("sampled", "epoch"), "profile.mode", f"must be 'sampled' or 'epoch', got {self.mode!r}")
        int_field(self, "warmup_iters", 0)
        int_field(self, "measure_iters", 1)


__all__ = ["ProfileSpec", "SpecError", "require", "int_field"]
