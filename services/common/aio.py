"""asyncio helpers the services share."""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until the event is set or timeout seconds passed; whether it is set.

    Unlike `asyncio.wait_for(event.wait(), timeout)`, a cancel is never lost:
    on Python 3.11, wait_for swallows a cancel that comes as the event is
    set, so a loop around it cannot be stopped (its task never ends)."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return event.is_set()
