"""Executor events and GPU claims: a claim goes back when the attempt that used the GPU released it,
whatever order the nodes' event streams arrive in (real etcd)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.planner import state as st
from services.planner.dispatcher import Dispatcher
from services.planner.report import Event
from services.planner.state import JobRecord, PlannerState

N0 = [("n0", 0), ("n0", 1)]
N1 = [("n1", 0), ("n1", 1)]
GPUS = N0 + N1


async def running(store, attempt: int, epochs_done: int) -> Dispatcher:
    """A planner whose job a runs on GPUS (attempt `attempt`), holding their claims and allocations."""
    d = Dispatcher(PlannerState(store), "127.0.0.1:1", "127.0.0.1:1")
    lease = await store.grant_lease(30)
    job = JobRecord(spec={"job_id": "a", "epochs": 4}, state=st.RUNNING, attempt=attempt, gpus=tuple(GPUS),
                    target=tuple(GPUS), epochs_done=epochs_done)
    assert await d._write("a", record=job, claim={g: lease for g in GPUS},
                          put={n: (b"directive", lease) for n in ("n0", "n1")})
    assert len(await allocations(store)) == 2
    return d


async def allocations(store) -> list:
    from services.registry import convert as keys

    return (await store.list(keys.ALLOCS))[0]


async def test_a_node_that_ends_its_part_of_a_finishing_job_first_gives_its_gpus_back(etcd_store):
    """A node without rank 0 releases its GPUs before rank 0's node reports FINISHED (the planner follows
    each node on its own stream): its claims go back all the same, none is left once the job is done."""
    d = await running(etcd_store, attempt=1, epochs_done=3)
    released = Event("n1", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N1), epoch=4)
    await d._on_event(released)
    assert await d.state.claims() == {g: "a" for g in N0}
    await d._on_event(Event("n0", "a", "finished", 1.0, attempt_id="a-a1", epoch=4))
    await d._on_event(replace(released, node_id="n0", gpus=tuple(N0)))
    assert d.owner == {} and await d.state.claims() == {}
    assert d.records["a"].state == st.FINISHED
    # and its allocations are gone: an executor that restarts does not run it again
    assert await allocations(etcd_store) == []


async def test_an_older_attempts_release_leaves_the_gpus_the_job_moved_onto(etcd_store):
    d = await running(etcd_store, attempt=2, epochs_done=2)  # it ran on n0 (attempt 1), now on n0 and n1
    await d._on_event(Event("n0", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N0), epoch=2))
    assert await d.state.claims() == {g: "a" for g in GPUS}


async def test_a_move_whose_allocation_could_not_be_written_is_written_when_the_event_comes_again(etcd_store):
    """The old attempt is gone, but etcd fails the write of the new nodes' allocations: nothing is lost,
    the event (not stored with the cursor, so it comes again) writes them."""
    from services.common.etcd import EtcdUnavailable

    d = await running(etcd_store, attempt=2, epochs_done=2)  # a moves from n0 + n1 (attempt 1) ...
    lease = await etcd_store.grant_lease(30)
    d._after_release["a"] = ({"n2": (b"directive", lease)}, set(GPUS))  # ... onto n2, which waits for that
    await d._on_event(Event("n0", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N0), epoch=2))
    change, calls = d.state.change, []

    async def unavailable(*args, **kw):
        calls.append(kw)
        raise EtcdUnavailable("etcd away")

    d.state.change = unavailable
    released = Event("n1", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N1), epoch=2)
    with pytest.raises(EtcdUnavailable):
        await d._on_event(released)
    assert calls and "a" in d._after_release
    d.state.change = change
    await d._on_event(released)  # the stream reopens at the cursor: the same event again
    assert "a" not in d._after_release
    assert any(kv.key.endswith("n2/a") for kv in await allocations(etcd_store))
