"""ExecutorService across nodes and GPU sets: a job spanning two executors
trains as one DDP world; a job resized 2 -> 1 mid-run trains every epoch
exactly once and gives the dropped GPU back. Each executor is driven by its
node's allocation, as the planner writes it."""

from __future__ import annotations

from services.executor import convert
from omru import checkpoint
from tests.executor.service_builders import K, RESIZE, START, directive, executors, gpu, is_event, tiny_job


def _epochs(events, job_id):
    return events.of(job_id, K.EXECUTOR_EVENT_KIND_EPOCH_DONE)


async def test_a_job_spanning_two_executors_trains_as_one_world_across_both(registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 1), ("n2", 1), store=etcd_store) as (a, b):
        ev_a, ev_b = a.events(), b.events()
        shared = tmp_path / "shared-checkpoints"
        d = directive("d-span", START, tiny_job("span", epochs=2), [gpu("n1", 0), gpu("n2", 0)],
                      rendezvous_endpoint="127.0.0.1:0", attempt_id="span-a1", checkpoint_dir=str(shared))
        # as the planner writes it: port 0, rank 0 binds one and publishes it in the shared folder;
        # rank 1's node first: its worker waits for that endpoint, then in the rendezvous for rank 0
        await b.start_job(d)
        await a.start_job(d)
        await ev_a.wait_for(is_event("span", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))
        await ev_b.wait_for(is_event("span", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))

        assert [(e.epoch, e.world_size) for e in _epochs(ev_a, "span")] == [(1, 2), (2, 2)]
        assert ev_a.of("span", K.EXECUTOR_EVENT_KIND_FINISHED)
        # rank 1's node reports its own start and release, never epochs it does not see
        assert [e.kind for e in ev_b.of("span")] == [K.EXECUTOR_EVENT_KIND_STARTED, K.EXECUTOR_EVENT_KIND_GPUS_RELEASED]
        assert [(g.node_id, g.index) for g in ev_b.of("span")[-1].gpus] == [("n2", 0)]
        assert (await b.job("span")).phase == "finished"  # told by the shared checkpoint folder
        spec = convert.train_spec(tiny_job("span", epochs=2))
        newest = checkpoint.load(checkpoint.latest(str(shared)), spec.model, spec.fingerprint())
        assert newest["world_size"] == 2 and newest["epoch"] == 2
        ev_a.close(), ev_b.close()


async def test_a_job_resized_from_two_gpus_to_one_mid_run_trains_every_epoch_exactly_once(
        registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2), store=etcd_store) as (ex,):
        events = ex.events()
        job = tiny_job("rs", epochs=5)
        await ex.start_job(directive("d1", START, job, [gpu("n1", 0), gpu("n1", 1)]))
        await events.wait_for(is_event("rs", K.EXECUTOR_EVENT_KIND_EPOCH_DONE, epoch=1))
        await ex.resize_job(directive("d2", RESIZE, job, [gpu("n1", 0)]))
        await ex.resize_job(directive("d2", RESIZE, job, [gpu("n1", 0)]))  # written again: one move

        released = await events.wait_for(is_event("rs", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))
        # the old attempt is gone from both: it gave n1:1 back and handed n1:0 to the new one
        assert [(g.node_id, g.index) for g in released.gpus] == [("n1", 1), ("n1", 0)]
        assert released.attempt_id == events.of("rs", K.EXECUTOR_EVENT_KIND_STARTED)[0].attempt_id
        await events.wait_for(is_event("rs", K.EXECUTOR_EVENT_KIND_FINISHED))
        await events.wait_for(lambda e: e.job_id == "rs" and e.kind == K.EXECUTOR_EVENT_KIND_GPUS_RELEASED
                              and e.seq > released.seq)

        epochs = _epochs(events, "rs")
        assert [e.epoch for e in epochs] == [1, 2, 3, 4, 5]  # every epoch, each once
        sizes = [e.world_size for e in epochs]
        k = sizes.index(1)
        assert sizes == [2] * k + [1] * (5 - k) and k >= 1
        starts = events.of("rs", K.EXECUTOR_EVENT_KIND_STARTED)
        assert [(s.world_size, s.epoch) for s in starts] == [(2, 0), (1, k)]  # resumed where the resize stopped
        assert starts[0].attempt_id != starts[1].attempt_id
        # linear scaling rule: the lr follows the global batch (1 epoch of re-warm-up after the resize)
        assert all(abs(e.lr - 0.1) < 1e-9 for e in epochs[:k])
        assert all(abs(e.lr - 0.05) < 1e-9 for e in epochs[k + 1:])
        assert 0.05 <= epochs[k].lr <= 0.1
        events.close()
