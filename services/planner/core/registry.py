"""Policies registered by name behind one signature: plan(PlanningInput) -> Plan."""

from __future__ import annotations

from typing import Callable

from services.planner.core.model import Plan, PlanningError, PlanningInput

Policy = Callable[[PlanningInput], Plan]

_POLICIES: dict[str, Policy] = {}


def register(name: str) -> Callable[[Policy], Policy]:
    """Decorator: make `fn` the policy called `name`."""

    def wrap(fn: Policy) -> Policy:
        if name in _POLICIES:
            raise ValueError(f"policy {name!r} registered twice")
        _POLICIES[name] = fn
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


def plan(name: str, problem: PlanningInput) -> Plan:
    """Plan `problem` with the policy called `name`."""
    return get(name)(problem)


def _load() -> None:
    # Importing the package registers every policy in it.
    import services.planner.core.policies  # noqa: F401
