"""Policies registered by name behind one signature: plan(PlanningInput) -> Plan.

Each policy declares the options it reads from `PlanningInput.options` when it
is registered (`options`), so that a caller can refuse the ones it does not
know (`omru simulate --option`). The online replay's `committed` and `start_s`
(core/simulator.py, the planner service) are given to every policy and are no
policy's options.
"""

from __future__ import annotations

from typing import Callable, Iterable

from services.planner.core.model import Plan, PlanningError, PlanningInput

Policy = Callable[[PlanningInput], Plan]

_POLICIES: dict[str, Policy] = {}
_OPTIONS: dict[str, tuple[str, ...]] = {}


def register(name: str, options: Iterable[str] = ()) -> Callable[[Policy], Policy]:
    """Decorator: make `fn` the policy called `name`, which reads the options named `options`."""

    def wrap(fn: Policy) -> Policy:
        if name in _POLICIES:
            raise ValueError(f"policy {name!r} registered twice")
        _POLICIES[name] = fn
        _OPTIONS[name] = tuple(sorted(options))
        return fn

    return wrap


def names() -> list[str]:
    _load()
    return sorted(_POLICIES)


def get(name: str) -> Policy:
    _load()
    try:
        return _POLICIES[name]
    except KeyError:
        raise PlanningError(f"unknown policy {name!r}; known: {', '.join(sorted(_POLICIES))}") from None


def options(name: str) -> tuple[str, ...]:
    """The options the policy called `name` reads, sorted."""
    get(name)
    return _OPTIONS[name]


def plan(name: str, problem: PlanningInput) -> Plan:
    """Plan `problem` with the policy called `name`."""
    return get(name)(problem)


def _load() -> None:
    # Importing the package registers every policy in it.
    import services.planner.core.policies  # noqa: F401
