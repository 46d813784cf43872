"""services.common.aio: waiting on an event never loses a cancel (Python 3.11's wait_for can)."""

from __future__ import annotations

import asyncio

from services.common.aio import wait_event


async def test_a_loop_waiting_on_an_event_stops_when_cancelled_as_the_event_is_set():
    event = asyncio.Event()
    rounds = 0

    async def loop():
        nonlocal rounds
        while True:
            await wait_event(event, 10)
            event.clear()
            rounds += 1

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    event.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert done and task.cancelled() and rounds == 0


async def test_wait_event_says_whether_the_event_was_set():
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5) is True
