"""An executor keeps its node's workers at the allocations in etcd
(RegistryService.WatchAllocations): it starts an allocated attempt once however
often it is written, never claims or releases the GPUs itself (the planner's
claims stay), reports a refused allocation as a FAILED event, and after a broken
stream reconciles to the snapshot it gets (a job whose allocation vanished
meanwhile is stopped). The allocations are written as the planner writes them
(PlannerState.change); the registry, executor and workers are real."""

from __future__ import annotations

from tests.conftest import start_registry
from tests.executor.service_builders import (K, START, claims_of, directive, executors, gpu, is_event, is_refusal_of,
                                             tiny_job)


async def test_allocations_start_once_refusals_become_failed_events_and_claims_stay_the_planners(registry, etcd_store, tmp_path):
    job = directive("a-1", START, tiny_job("alloc", epochs=2), [gpu("n1", 0)], attempt_id="alloc-a1")
    bad = directive("b-1", START, tiny_job("bad", model="no-such-net"), [gpu("n1", 1)], attempt_id="bad-a1")
    async with executors(registry.address, tmp_path, ("n1", 2), store=etcd_store) as (ex,):
        events = ex.events()
        await ex.start_job(job)
        await events.wait_for(is_event("alloc", K.EXECUTOR_EVENT_KIND_STARTED))
        await ex.start_job(job)  # written again (a new revision): nothing is redone
        await ex.start_job(bad)
        refused = await events.wait_for(is_refusal_of(bad))
        assert refused.job_id == "bad" and "no-such-net" in refused.message
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
    long = directive("l-1", START, tiny_job("long", epochs=50), [gpu("n1", 0)], attempt_id="long-a1")
    try:
        async with executors(registry.address, tmp_path, ("n1", 1), store=etcd_store) as (ex,):
            events = ex.events()
            await ex.start_job(long)
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
