"""ExecutorService: a job started by its allocation trains for real (gloo
workers), streams its epochs, finishes and gives its GPUs back; an allocation
written again is not redone; removing one stops the job at an epoch boundary;
the event log replays; a profiling trial reports its speed."""

from __future__ import annotations

from omru.v1 import common_pb2, executor_pb2
from tests.executor.service_builders import K, START, directive, executors, gpu, is_event, tiny_job


async def test_a_started_job_streams_every_epoch_then_finished_and_gpus_released(registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2), store=etcd_store) as (ex,):
        events = ex.events()
        d = directive("d-start", START, tiny_job("j1", epochs=3), [gpu("n1", 0), gpu("n1", 1)])
        await ex.start_job(d)
        await events.wait_for(is_event("j1", K.EXECUTOR_EVENT_KIND_STARTED))
        await ex.start_job(d)  # written again: nothing is redone (one STARTED below)

        await events.wait_for(is_event("j1", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))
        kinds = [e.kind for e in events.of("j1")]
        assert kinds == [K.EXECUTOR_EVENT_KIND_STARTED, *[K.EXECUTOR_EVENT_KIND_EPOCH_DONE] * 3,
                         K.EXECUTOR_EVENT_KIND_FINISHED, K.EXECUTOR_EVENT_KIND_GPUS_RELEASED]
        started = events.of("j1", K.EXECUTOR_EVENT_KIND_STARTED)[0]
        assert (started.epoch, started.world_size, started.restarts) == (0, 2, 0)
        epochs = events.of("j1", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)
        assert [e.epoch for e in epochs] == [1, 2, 3]
        for e in epochs:
            assert e.epoch_seconds > 0 and e.loss > 0 and 0 <= e.accuracy <= 1
            assert e.world_size == 2 and e.global_batch == 16 and e.node_id == "n1"
            assert abs(e.lr - 0.05 * 16 / 8) < 1e-9  # linear scaling rule: base_lr x global batch / base batch
        released = events.of("j1", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED)[0]
        assert sorted((g.node_id, g.index) for g in released.gpus) == [("n1", 0), ("n1", 1)]
        seqs = [e.seq for e in events.items]
        assert seqs == list(range(1, len(seqs) + 1))

        job = await ex.job("j1")
        assert (job.state, job.phase, job.epochs_done, job.world_size) == (common_pb2.JOB_STATE_FINISHED, "finished", 3, 2)
        assert list(job.worker_pids) == []

        # The log replays from any seq; removing a finished job's allocation changes nothing.
        replay = ex.events(after_seq=seqs[2])
        await replay.wait_for(lambda e: e.seq == seqs[-1])
        assert [e.seq for e in replay.items] == seqs[3:]
        replay.close()
        await ex.stop_job("j1")
        await events.wait_for(lambda e: e.job_id == "j1" and e.seq > seqs[-1])  # (its GPUs: released already)
        assert (await ex.job("j1")).phase == "finished"
        assert len(events.of("j1", K.EXECUTOR_EVENT_KIND_STARTED)) == 1
        events.close()


async def test_a_removed_allocation_ends_the_job_at_an_epoch_boundary_and_releases_its_gpus(
        registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 1), store=etcd_store) as (ex,):
        events = ex.events()
        await ex.start_job(directive("d1", START, tiny_job("j-stop", epochs=50), [gpu("n1", 0)]))
        await events.wait_for(is_event("j-stop", K.EXECUTOR_EVENT_KIND_EPOCH_DONE, epoch=1))
        await ex.stop_job("j-stop")
        released = await events.wait_for(is_event("j-stop", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))
        done = [e.epoch for e in events.of("j-stop", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)]
        assert done == list(range(1, len(done) + 1)) and len(done) < 50
        assert released.epoch == done[-1]
        assert not events.of("j-stop", K.EXECUTOR_EVENT_KIND_FINISHED)
        job = await ex.job("j-stop")
        assert (job.phase, job.epochs_done) == ("stopped", done[-1])
        events.close()


async def test_a_profile_directive_reports_steady_state_iteration_and_epoch_seconds(registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2), store=etcd_store) as (ex,):
        events = ex.events()
        options = executor_pb2.ProfileOptions(warmup_iters=1, measure_iters=3)
        # a trial may measure more GPUs than the job will ever use (max_gpus 1)
        d = directive("p1", START, tiny_job("prof", epochs=5, max_gpus=1), [gpu("n1", 0), gpu("n1", 1)], profile=options)
        await ex.start_job(d)
        profiled = await events.wait_for(is_event("prof", K.EXECUTOR_EVENT_KIND_PROFILED))
        await events.wait_for(is_event("prof", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))
        assert profiled.iter_seconds > 0 and profiled.world_size == 2 and profiled.global_batch == 16
        assert profiled.steps == 64 // 16  # train_samples / global batch
        assert abs(profiled.epoch_seconds - profiled.iter_seconds * profiled.steps) < 1e-9
        assert not events.of("prof", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)  # a trial trains no epoch
        assert (await ex.job("prof")).state == common_pb2.JOB_STATE_FINISHED
        assert not (tmp_path / "n1" / "jobs" / "prof").exists()  # and writes no checkpoint
        events.close()
