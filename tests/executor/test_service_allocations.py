"""An executor keeps its node's workers at the allocations in etcd
(RegistryService.WatchAllocations): it starts an allocated attempt once however
often it is written, never claims or releases the GPUs itself (the planner's
claims stay), refuses a directive by call for a job it runs for an allocation, reports a refused allocation as a FAILED event, and after a broken
stream reconciles to the snapshot it gets (a job whose allocation vanished
meanwhile is stopped). The allocations are written as the planner writes them
(PlannerState.change); the registry, executor and workers are real."""

from __future__ import annotations

import grpc
import pytest

from omru.v1 import executor_pb2
from services.planner.state import PlannerState
from tests.conftest import start_registry
from tests.executor.service_builders import K, START, STOP, claims_of, directive, executors, gpu, is_event, tiny_job


async def node_lease(etcd_store, node_id: str) -> int:
    from services.registry import convert

    return convert.node_from_kv(await etcd_store.get(convert.node_key(node_id))).lease_id


async def allocate(state: PlannerState, lease: int, d: executor_pb2.Directive, claim: bool = True) -> None:
    gpus = {(g.node_id, g.index): lease for g in d.gpus}
    result = await state.change(d.job.job_id, claim=gpus if claim else {},
                                put={"n1": (d.SerializeToString(deterministic=True), lease)})
    assert result.succeeded


async def test_allocations_start_once_refusals_become_failed_events_and_claims_stay_the_planners(registry, etcd_store, tmp_path):
    state = PlannerState(etcd_store)
    job = directive("a-1", START, tiny_job("alloc", epochs=2), [gpu("n1", 0)], attempt_id="alloc-a1")
    bad = directive("b-1", START, tiny_job("bad", model="no-such-net"), [gpu("n1", 1)], attempt_id="bad-a1")
    async with executors(registry.address, tmp_path, ("n1", 2)) as (ex,):
        events = ex.events()
        lease = await node_lease(etcd_store, "n1")
        await allocate(state, lease, job)
        await events.wait_for(is_event("alloc", K.EXECUTOR_EVENT_KIND_STARTED))
        # a StopJob the planner did not send (by call, not through the allocation) is refused: the job the
        # planner allocated runs on, and the planner does not wait for ever for a job nobody runs
        with pytest.raises(grpc.aio.AioRpcError) as stray:
            await ex.stop_job(directive("stray", STOP, tiny_job("alloc")))
        assert stray.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "'alloc' runs for the planner's allocation" in stray.value.details()
        await allocate(state, lease, job, claim=False)  # written again (a new revision): nothing is redone
        await allocate(state, lease, bad)
        refused = await events.wait_for(is_event("bad", K.EXECUTOR_EVENT_KIND_FAILED))
        assert "directive 'b-1' refused" in refused.message and "no-such-net" in refused.message
        await events.wait_for(is_event("alloc", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))
        assert len(events.of("alloc", K.EXECUTOR_EVENT_KIND_STARTED)) == 1
        assert [e.epoch for e in events.of("alloc", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)] == [1, 2]
        # the executor neither claimed nor released: the planner's claims are as it wrote them
        assert await claims_of(registry.address, "alloc") == [("n1", 0)]
        assert await claims_of(registry.address, "bad") == [("n1", 1)]
        events.close()


async def test_after_a_broken_stream_the_snapshot_stops_what_lost_its_allocation(etcd, etcd_store, free_port, tmp_path):
    from services.registry import convert

    port = free_port()
    registry = await start_registry(etcd.endpoint, port=port)
    state = PlannerState(etcd_store)
    long = directive("l-1", START, tiny_job("long", epochs=50), [gpu("n1", 0)], attempt_id="long-a1")
    try:
        async with executors(registry.address, tmp_path, ("n1", 1)) as (ex,):
            events = ex.events()
            await allocate(state, await node_lease(etcd_store, "n1"), long)
            await events.wait_for(is_event("long", K.EXECUTOR_EVENT_KIND_EPOCH_DONE, epoch=1))
            await registry.stop(0)  # the stream breaks; meanwhile the allocation goes
            await etcd_store.delete(convert.alloc_key("n1", "long"))
            registry = await start_registry(etcd.endpoint, port=port)
            released = await events.wait_for(is_event("long", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED), timeout=60)
            assert [(g.node_id, g.index) for g in released.gpus] == [("n1", 0)]
            assert (await ex.job("long")).phase == "stopped"
            assert len(events.of("long", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)) < 50
            events.close()
    finally:
        await registry.stop(0)
