"""What omru.elastic shares with the executor's worker specs: `ProfileSpec` (a profiling trial, which a
script reads from OMRU_PROFILE) and `SpecError`, with the checks both use; and
the limits of client input every service and the workload loader apply
(`MAX_*`, `too_long`), with `shown`, which cuts a value echoed in an error
message to a readable size.

services/executor/worker/spec.py builds `TrainSpec` and `AttemptSpec` on
these; this module needs nothing of the services package.
"""

from __future__ import annotations

from dataclasses import dataclass


#: Limits of client input (README, "Input limits"); longer or more is refused naming the field.
MAX_ID = 128  # job, node, attempt and directive ids
MAX_NAME = 255  # model names, GPU kinds, policy names, environment variable names, host:port addresses
MAX_TEXT = 4096  # paths (data set, workdir, checkpoint folder), command arguments, environment values
MAX_ITEMS = 1024  # command arguments, environment variables of one job
MAX_GPUS_PER_NODE = 256  # GPUs (or CPU slots) one node may offer; indices 0..255
#: Characters of a value an error message echoes (the rest is counted, not shown).
SHOWN = 64


def shown(value: object, limit: int = SHOWN) -> str:
    """repr(value) for an error message: at most `limit` characters of it, then "...(N chars)"."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}...({len(value)} chars)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def too_long(value: str, limit: int) -> str | None:
    """Why `value` is refused for its length (None when it is at most `limit` characters)."""
    if len(value) > limit:
        return f"{shown(value)} is longer than {limit} characters"
    return None


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


__all__ = ["ProfileSpec", "SpecError", "require", "int_field", "shown", "too_long", "MAX_ID", "MAX_NAME", "MAX_TEXT",
           "MAX_ITEMS", "MAX_GPUS_PER_NODE"]
