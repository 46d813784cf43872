"""Executor events and GPU claims: a claim goes back when the attempt that used the GPU released it,
whatever order the nodes' event streams arrive in (real etcd)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from services.executor.worker.spec import TrainSpec
from services.planner import state as st
from services.planner.core.model import Job
from services.planner.dispatcher import Dispatcher
from services.planner.follow import Move, Step
from services.planner.report import Event
from services.planner.state import JobRecord, PlannerState

N0 = [("n0", 0), ("n0", 1)]
N1 = [("n1", 0), ("n1", 1)]
GPUS = N0 + N1


async def running(store, attempt: int, epochs_done: int) -> Dispatcher:
    """A planner whose job a runs on GPUS (attempt `attempt`), holding their claims and allocations."""
    d = Dispatcher(PlannerState(store), "127.0.0.1:1", "127.0.0.1:1")
    lease = await store.grant_lease(30)
    spec = TrainSpec(job_id="a", model="resnet18", epochs=4).to_dict()
    job = JobRecord(spec=spec, state=st.RUNNING, attempt=attempt, gpus=tuple(GPUS),
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


async def test_an_event_of_an_attempt_the_planner_wrote_but_has_not_seen_stored_is_judged_by_the_stored_record(
        etcd_store):
    """An executor can refuse an allocation before the planner's write of it has returned (milliseconds):
    the refusal names an attempt newer than the record in memory, and must not be dropped as stale."""
    d = await running(etcd_store, attempt=3, epochs_done=0)
    d.records["a"] = replace(d.records["a"], attempt=2, state=st.WAITING, gpus=(), target=())  # the write's reply lags
    await d._on_event(Event("n0", "a", "failed", 1.0, attempt_id="a-a3", epoch=0, message="out of memory"))
    assert d.records["a"].state == st.FAILED and "out of memory" in d.records["a"].message
    assert await allocations(etcd_store) == []


async def test_an_older_attempts_release_leaves_the_gpus_the_job_moved_onto(etcd_store):
    d = await running(etcd_store, attempt=2, epochs_done=2)  # it ran on n0 (attempt 1), now on n0 and n1
    await d._on_event(Event("n0", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N0), epoch=2))
    assert await d.state.claims() == {g: "a" for g in GPUS}


async def moving(store) -> Dispatcher:
    """A planner whose job a moves from n0 + n1 (attempt 1) onto n0 + n2 (attempt 2): n2's allocation waits
    until attempt 1 released its GPUs everywhere."""
    from omru.v1 import registry_pb2

    d = await running(store, attempt=1, epochs_done=2)
    lease = await store.grant_lease(30)
    d.nodes = {n: registry_pb2.Node(node_id=n, address=f"127.0.0.1:{5000 + i}", lease_id=lease)
               for i, n in enumerate(("n0", "n1", "n2"))}
    d.owner = {g: "a" for g in GPUS}
    await d._act(Move("a", "resize", (*N0, ("n2", 0)), Step("a", (*N0, ("n2", 0)), 3, 0.0, 1)))
    r = d.records["a"]
    assert (r.attempt, r.joining, set(r.releasing)) == (2, ("n2",), set(GPUS))
    assert {kv.key.rpartition("/")[0].rpartition("/")[2] for kv in await allocations(store)} == {"n0"}
    return d


async def test_a_move_whose_allocation_could_not_be_written_is_written_when_the_event_comes_again(etcd_store):
    """The old attempt is gone, but etcd fails the write of the new nodes' allocations: nothing is lost,
    the event (not stored with the cursor, so it comes again) writes them."""
    from services.common.etcd import EtcdUnavailable

    d = await moving(etcd_store)
    await d._on_event(Event("n0", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N0), epoch=2))
    change, calls = d.state.change, []

    async def unavailable(*args, **kw):
        calls.append(kw)
        raise EtcdUnavailable("etcd away")

    d.state.change = unavailable
    released = Event("n1", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N1), epoch=2)
    with pytest.raises(EtcdUnavailable):
        await d._on_event(released)
    assert calls and d.records["a"].joining == ("n2",)
    d.state.change = change
    await d._on_event(released)  # the stream reopens at the cursor: the same event again
    assert d.records["a"].joining == ()
    assert any(kv.key.endswith("n2/a") for kv in await allocations(etcd_store))


async def test_a_move_whose_old_attempt_stops_before_the_write_returned_still_joins(etcd_store):
    """A move off every node the job ran on drops their allocations; their executors stop the old attempt
    and release its GPUs within milliseconds, before the planner's write has returned. Those releases are
    judged against the record that write stored (the old attempt is no longer current), so the joining
    node gets its allocation; judged against the record before it, the job waited forever."""
    import asyncio

    from omru.v1 import registry_pb2

    d = await running(etcd_store, attempt=1, epochs_done=2)
    lease = await etcd_store.grant_lease(30)
    d.nodes = {n: registry_pb2.Node(node_id=n, address=f"127.0.0.1:{5000 + i}", lease_id=lease)
               for i, n in enumerate(("n0", "n1", "n2"))}
    d.owner = {g: "a" for g in GPUS}
    change, handled = d.state.change, []

    async def then_the_releases(job_id, **kw):
        result = await change(job_id, **kw)
        if kw.get("drop"):  # the old nodes' streams bring their releases while the reply is on its way
            handled.append(asyncio.get_running_loop().create_task(d._on_events(
                [Event(n, "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(gs), epoch=2)
                 for n, gs in (("n0", N0), ("n1", N1))])))
            await asyncio.sleep(0.2)
        return result

    d.state.change = then_the_releases
    n2 = (("n2", 0),)
    await d._act(Move("a", "resize", n2, Step("a", n2, 3, 0.0, 1)))
    await asyncio.wait_for(handled[0], 10)
    r = d.records["a"]
    assert (r.attempt, r.joining, r.releasing) == (2, (), ())
    assert {kv.key.rpartition("/")[0].rpartition("/")[2] for kv in await allocations(etcd_store)} == {"n2"}
    assert await d.state.claims() == {("n2", 0): "a"}


async def test_a_planner_that_takes_over_finishes_a_move_the_other_began(etcd_store):
    """The move waits in the job's record, not in the planner's memory: a planner started afresh on the same
    etcd writes the joining node's allocation when the old attempt's last release comes."""
    first = await moving(etcd_store)
    await first._on_event(Event("n0", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N0), epoch=2))
    second = Dispatcher(PlannerState(etcd_store), "127.0.0.1:1", "127.0.0.1:1")  # the first one died here
    second.records = {r.job_id: r for r in await second.state.jobs()}
    second.owner, second.nodes = await second.state.claims(), first.nodes
    assert second.records["a"].releasing == tuple(N1)
    await second._on_event(Event("n1", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N1), epoch=2))
    assert any(kv.key.endswith("n2/a") for kv in await allocations(etcd_store))
    assert (await second.state.job("a")).joining == ()
    assert await second.state.claims() == {g: "a" for g in (*N0, ("n2", 0))}


async def test_a_job_whose_attempt_released_every_gpu_is_not_moved_before_its_outcome_comes(etcd_store):
    """Every node of a finishing job released its GPUs, but rank 0's node's FINISHED (another stream) lags:
    the planner does not send the job a planned move (the attempt would wait for ranks that never come),
    and the GPUs it released go to the next job at once."""
    from omru.v1 import common_pb2, registry_pb2

    d = await moving(etcd_store)  # (only for its nodes) a's move to attempt 2 ...
    d.nodes = {n: registry_pb2.Node(node_id=n, address=node.address, lease_id=node.lease_id,
                                    gpus=[common_pb2.GpuInfo(index=i) for i in range(2)])
               for n, node in d.nodes.items()}
    for node, gpus in (("n0", N0), ("n1", N1)):
        await d._on_event(Event(node, "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(gpus), epoch=2))
    await d._update("a", lambda c: replace(c, state=st.RUNNING, gpus=c.target))
    for node in ("n0", "n2"):  # ... ran and ended everywhere
        gpus = tuple(g for g in d.records["a"].gpus if g[0] == node)
        await d._on_event(Event(node, "a", "gpus_released", 1.0, attempt_id="a-a2", gpus=gpus, epoch=4))
    assert d.owner == {}
    b = JobRecord(spec=TrainSpec(job_id="b", model="resnet18", epochs=2).to_dict(), state=st.WAITING,
                  profile={1: 1.0})
    await d.state.create_jobs([b])
    d.records["b"] = await d.state.job("b")
    d.records["a"] = replace(d.records["a"], profile={1: 1.0})
    d._adopt([Step("a", tuple(N1), 3, 0.0, 1), Step("b", tuple(N0), 0, 0.0, 2)])
    await d._follow()
    await d.moved()
    assert d.records["a"].attempt == 2  # not moved onto n1
    assert d.records["b"].state == st.STARTING and set(d.records["b"].target) == set(N0)


async def test_a_batch_of_a_nodes_events_writes_each_jobs_epochs_once_and_stores_every_event(etcd_store):
    """A stream that fell behind catches up in fewer writes: a job's run of epoch_done events is one record
    write, the events around it keep their order, and every event is stored with the cursor past the last."""
    d = await running(etcd_store, attempt=1, epochs_done=0)
    d._timing["a"] = Job("a", 1, {4: 2.0})
    epoch = [Event("n0", "a", "epoch_done", 1.0 + i, seq=i + i // 3, attempt_id="a-a1", epoch=i,
                   world_size=4, epoch_seconds=2.0, accuracy=0.1 * i) for i in (1, 2, 3)]
    released = Event("n0", "a", "gpus_released", 3.5, seq=3, attempt_id="a-a0", gpus=(("n0", 0),), epoch=2)
    cas, writes = d.state.store.cas, []

    async def counted(key, *args, **kw):
        writes.append(key)
        return await cas(key, *args, **kw)

    d.state.store.cas = counted
    batch = [epoch[0], epoch[1], released, epoch[2]]
    await d._on_events(batch)
    await d.state.add_events(0, batch)
    assert len(writes) == 2  # epochs 1-2, then (after the release) epoch 3
    r = await d.state.job("a")
    assert (r.epochs_done, r.accuracy, r.observed[4, 2][1]) == (3, pytest.approx(0.3), 3)
    assert [(e.seq, e.kind) for e in await d.state.events()] == [(e.seq, e.kind) for e in batch]
    assert await d.state.cursor("n0") == (0, 4)


async def test_event_batches_take_what_arrived_and_end_with_the_streams_error():
    from services.planner.ingest import _batches

    class Call:
        def __init__(self, replies, error=None):
            self.replies, self.error, self.cancelled = replies, error, False

        async def __aiter__(self):
            for r in self.replies:
                yield r
            if self.error:
                raise self.error

        def cancel(self):
            self.cancelled = True

    class Reply:
        def __init__(self, event):
            self.event = event

    call = Call([Reply(i) for i in range(5)])
    assert [b async for b in _batches(call, lambda e: None if e == 2 else e)] == [[0, 1, 3, 4]]
    assert call.cancelled
    got, broken = [], Call([Reply(7)], ConnectionError("stream broken"))
    with pytest.raises(ConnectionError, match="stream broken"):
        async for b in _batches(broken, lambda e: e):
            got.append(b)
    assert got == [[7]]


async def test_a_claim_another_writer_left_is_forgotten_once_it_is_gone(etcd, registry, registry_stub, free_port):
    """A planner that starts while a job it does not run holds a GPU (a claim another writer made) counts
    the GPU taken; once that claim is gone from etcd, the planner's next pass frees the GPU for its jobs."""
    from services.common.etcd import EtcdStore
    from services.planner.state import PlannerState
    from tests.planner_service.planner_helpers import node_request, planner
    from tests.platform.platform_helpers import node_lease

    await registry_stub.RegisterNode(node_request("n0", 2, free_port()))
    async with EtcdStore(etcd.endpoint) as store:
        other = PlannerState(store)
        assert (await other.change("stranger", claim={("n0", 0): await node_lease(store, "n0")})).succeeded
        async with planner(etcd.endpoint, registry.address) as (_, d, _stub):
            for _ in range(100):
                if d.owner:
                    break
                await asyncio.sleep(0.05)
            assert d.owner == {("n0", 0): "stranger"}
            assert (await other.change("stranger", release=[("n0", 0)])).succeeded
            for _ in range(300):  # (the pass that looks comes every FOLLOW_EVERY_S when nothing happens)
                if not d.owner:
                    break
                await asyncio.sleep(0.05)
            assert d.owner == {}


async def parked(store) -> Dispatcher:
    """a runs on n0 (attempt 1) and b on n1; a parks to move onto n0 + n1 after its coming boundary."""
    from omru.v1 import registry_pb2

    d = Dispatcher(PlannerState(store), "127.0.0.1:1", "127.0.0.1:1")
    lease = await store.grant_lease(30)
    d.nodes = {n: registry_pb2.Node(node_id=n, address=f"127.0.0.1:{5000 + i}", lease_id=lease)
               for i, n in enumerate(("n0", "n1"))}
    for job, gpus in (("a", N0), ("b", N1)):
        spec = TrainSpec(job_id=job, model="resnet18", epochs=4).to_dict()
        record = JobRecord(spec=spec, state=st.RUNNING, attempt=1, gpus=tuple(gpus), target=tuple(gpus), epochs_done=1)
        assert await d._write(job, record=record, claim={g: lease for g in gpus}, put={gpus[0][0]: (b"d", lease)})
    await d._act(Move("a", "park", tuple(GPUS), Step("a", tuple(GPUS), 2, 0.0, 2)))
    return d


async def test_a_parked_job_stops_at_its_boundary_and_takes_the_gpus_it_awaits_as_they_are_released(etcd_store):
    """A runs on n0 and is planned onto n0 + n1 after its coming epoch boundary; b still holds n1. Parked,
    a's allocation goes (its attempt stops at that boundary), it keeps n0 and claims nothing of b's; b's
    release gives it n1, and with its old attempt stopped every node gets the new attempt at once."""
    d = await parked(etcd_store)
    a = d.records["a"]
    assert (a.state, a.attempt, a.joining, a.releasing, a.awaiting) == (st.RESIZING, 2, ("n0", "n1"), tuple(N0), tuple(N1))
    assert a.sent_s == 0.0  # nothing sent yet
    assert [kv.key.rpartition("/")[2] for kv in await allocations(etcd_store)] == ["b"]  # a's is gone
    assert await d.state.claims() == {**{g: "a" for g in N0}, **{g: "b" for g in N1}}
    # a's old attempt stops at its boundary: n0 stays a's (the step keeps it); b still runs
    await d._on_event(Event("n0", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N0), epoch=2))
    await d._book("a")
    assert d.records["a"].awaiting == tuple(N1) and d.records["a"].releasing == ()
    assert [kv.key.rpartition("/")[2] for kv in await allocations(etcd_store)] == ["b"]
    # b ends and releases n1: a takes it, and both nodes get a's new attempt
    await d._on_event(Event("n1", "b", "finished", 2.0, attempt_id="b-a1", epoch=4))
    await d._on_event(Event("n1", "b", "gpus_released", 2.0, attempt_id="b-a1", gpus=tuple(N1), epoch=4))
    await d._book("a")
    a = d.records["a"]
    assert (a.awaiting, a.joining) == ((), ()) and a.sent_s > 0
    assert await d.state.claims() == {g: "a" for g in GPUS}
    assert sorted(kv.key.rpartition("/")[0].rpartition("/")[2] for kv in await allocations(etcd_store)) == ["n0", "n1"]


async def test_a_parked_job_that_is_cancelled_gives_back_only_what_its_executors_released(etcd_store):
    """Cancelled while parked, a gives up its claim on n0 only when n0's executor released it (its old
    attempt may still be training its last epoch there), and awaits nothing more."""
    d = await parked(etcd_store)
    await d.cancel("a")
    assert d.records["a"].state == st.CANCELLED and d.records["a"].awaiting == ()
    assert await d.state.claims() == {**{g: "a" for g in N0}, **{g: "b" for g in N1}}
    await d._on_event(Event("n0", "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(N0), epoch=2))
    assert await d.state.claims() == {g: "b" for g in N1}


def test_a_job_parks_only_when_its_gpus_holder_is_due_after_its_boundary_but_soon_enough():
    """a: 100 s epochs on n0, 30 s on n0 + n1, its coming boundary in 20 s (job seconds, time scale 1);
    park iff b (50 s epochs) releases n1 after that boundary and less than 100 - 30 = 70 s after it."""
    import time

    from services.planner.follow import Live

    now = time.time()
    d = Dispatcher(None, "127.0.0.1:1", "127.0.0.1:1")
    spec = TrainSpec(job_id="a", model="resnet18", epochs=10).to_dict()
    d.records["a"] = JobRecord(spec=spec, state=st.RUNNING, gpus=tuple(N0), epochs_done=4, progress_s=now - 80)
    d._timing = {"a": Job("a", 10, {2: 100.0, 4: 30.0}), "b": Job("b", 6, {2: 50.0})}
    step = Step("a", tuple(GPUS), 5, 0.0, 5)

    def parks(b_epochs_done: int, b_elapsed_s: float, b_state: str = st.RUNNING) -> bool:
        spec = TrainSpec(job_id="b", model="resnet18", epochs=6).to_dict()
        d.records["b"] = JobRecord(spec=spec, state=b_state, gpus=tuple(N1), epochs_done=b_epochs_done,
                                   progress_s=now - b_elapsed_s)
        return d._worth_parking(Live("a", False, False, tuple(N0), 4), step, frozenset({"b"}))

    assert parks(5, 0.0)  # b releases in 50 s: 30 s after a's boundary
    assert not parks(5, 40.0)  # in 10 s, before the boundary: a moves as a plain resize then
    assert not parks(4, 0.0)  # in 100 s: 80 s after it, more than one of a's epochs there gains
    assert not parks(5, 0.0, st.RESIZING)  # b moving: when it releases is not known



async def test_a_late_step_that_a_pass_starts_is_not_taken_for_lateness(etcd_store):
    """b's start was planned long ago, and its GPUs came free only now: the pass that starts it does not
    replan for it (it is taking its step), while the same step with a GPU still held elsewhere is late."""
    from omru.v1 import common_pb2, registry_pb2

    d = Dispatcher(PlannerState(etcd_store), "127.0.0.1:1", "127.0.0.1:1")
    lease = await etcd_store.grant_lease(30)
    d.nodes = {"n0": registry_pb2.Node(node_id="n0", address="127.0.0.1:5000", lease_id=lease,
                                       gpus=[common_pb2.GpuInfo(index=i) for i in range(2)])}
    spec = TrainSpec(job_id="b", model="resnet18", epochs=4).to_dict()
    d.records["b"] = JobRecord(spec=spec, state=st.WAITING, profile={1: 10.0, 2: 6.0})
    d._adopt([Step("b", tuple(N0), 0, 5.0, 4)])
    d._plan_origin, d._plan_makespan = time.time() - 1_000.0, 100.0  # planned 995 s ago; the slack is 5 s
    d.owner[N0[1]] = "c"  # held by a job that ended and has not released it yet
    await d._follow()
    assert "b" not in d._acting and d._dirty.is_set()  # b cannot start, n0:0 idles: late, replan
    d._dirty.clear()
    del d.owner[N0[1]]
    d._late_in = -1
    await d._follow()
    assert "b" in d._acting and not d._dirty.is_set()  # started now: no replan
    await d._acting["b"]


async def test_a_requeued_job_started_elsewhere_joins_once_its_old_attempt_released(etcd_store):
    """a was requeued while its attempt on n0 + n1 still trains to its epoch boundary (its record no longer
    names those GPUs, its claims stay until the executors release them). Started on n1 + n2, n1's
    allocation goes at once (n1's executor moves it at that boundary) and n2's waits for the release
    everywhere: sooner, n2's ranks would begin from the checkpoint before the epoch still being trained."""
    from omru.v1 import registry_pb2

    d = await running(etcd_store, attempt=1, epochs_done=2)
    lease = await etcd_store.grant_lease(30)
    d.nodes = {n: registry_pb2.Node(node_id=n, address=f"127.0.0.1:{5000 + i}", lease_id=lease)
               for i, n in enumerate(("n0", "n1", "n2"))}
    d.owner = {g: "a" for g in GPUS}
    await d._requeue(d.records["a"], "n0 refused it")
    assert d.records["a"].state == st.WAITING and await allocations(etcd_store) == []
    step = (*N1, ("n2", 0))
    await d._act(Move("a", "start", step, Step("a", step, 2, 0.0, 2)))
    r = d.records["a"]
    assert (r.state, r.attempt, r.joining, set(r.releasing)) == (st.STARTING, 3, ("n2",), set(GPUS))
    assert [kv.key.rpartition("/")[0].rpartition("/")[2] for kv in await allocations(etcd_store)] == ["n1"]
    for node, gpus in (("n0", N0), ("n1", N1)):
        await d._on_event(Event(node, "a", "gpus_released", 1.0, attempt_id="a-a1", gpus=tuple(gpus), epoch=3))
    assert sorted(kv.key.rpartition("/")[0].rpartition("/")[2] for kv in await allocations(etcd_store)) == ["n1", "n2"]
    assert d.records["a"].joining == ()
