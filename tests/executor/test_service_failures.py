"""ExecutorService under worker failure and bad allocations: a killed worker
costs at most the epoch in progress; restarts are bounded; every bad allocation
is refused (a FAILED event) naming the problem and the running job goes on
untouched."""

from __future__ import annotations

import asyncio

from omru.v1 import executor_pb2
from omru import checkpoint
from services.executor.servicer import is_refusal
from tests.executor.service_builders import (K, RESIZE, START, directive, executors, gpu, is_event, is_refusal_of,
                                             kill, tiny_job)


async def test_a_killed_worker_restarts_from_the_last_checkpoint_and_loses_at_most_that_epoch(
        registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2), store=etcd_store) as (ex,):
        events = ex.events()
        job = tiny_job("crash", epochs=4, train_samples=256)
        await ex.start_job(directive("d1", START, job, [gpu("n1", 0), gpu("n1", 1)]))
        await events.wait_for(is_event("crash", K.EXECUTOR_EVENT_KIND_EPOCH_DONE, epoch=1))
        await asyncio.sleep(0.3)  # into epoch 2
        before = (await ex.job("crash"))
        done_at_kill = len(events.of("crash", K.EXECUTOR_EVENT_KIND_EPOCH_DONE))
        kill(before.worker_pids[1])

        restarted = await events.wait_for(is_event("crash", K.EXECUTOR_EVENT_KIND_STARTED, restarts=1))
        assert restarted.epoch == done_at_kill  # resumes after the last completed epoch: nothing completed is lost
        assert "killed by signal 9" in restarted.message
        assert restarted.attempt_id == before.attempt_id  # the directive's attempt, on a fresh store prefix:
        assert f"store prefix {before.attempt_id}.r1" in restarted.message
        await events.wait_for(is_event("crash", K.EXECUTOR_EVENT_KIND_FINISHED))
        assert [e.epoch for e in events.of("crash", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)] == [1, 2, 3, 4]
        job_now = await ex.job("crash")
        assert (job_now.phase, job_now.restarts, job_now.epochs_done) == ("finished", 1, 4)
        events.close()


async def test_a_job_whose_workers_keep_dying_fails_after_max_restarts_and_releases_its_gpus(
        registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 1), max_restarts=0, store=etcd_store) as (ex,):
        events = ex.events()
        await ex.start_job(directive("d1", START, tiny_job("doomed", epochs=50), [gpu("n1", 0)]))
        await events.wait_for(is_event("doomed", K.EXECUTOR_EVENT_KIND_STARTED))
        kill((await ex.job("doomed")).worker_pids[0])
        failed = await events.wait_for(is_event("doomed", K.EXECUTOR_EVENT_KIND_FAILED))
        assert "gave up after 0 restarts" in failed.message and "killed by signal 9" in failed.message
        await events.wait_for(is_event("doomed", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))
        assert (await ex.job("doomed")).phase == "failed"
        events.close()


def _foreign_checkpoint(folder) -> str:
    """A real checkpoint file of a resnet18 job (what another job left in the folder)."""
    return checkpoint.save(str(folder), {"job_id": "other", "model_name": "resnet18", "fingerprint": "f" * 16,
                                         "epoch": 1, "world_size": 1, "model": {}, "optimizer": {},
                                         "lr_schedule": {}, "rng": {}, "history": []})


async def test_each_bad_allocation_is_refused_naming_the_problem_and_the_running_job_goes_on(
        registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2), store=etcd_store) as (ex,):
        events = ex.events()
        await ex.start_job(directive("run", START, tiny_job("victim", epochs=4), [gpu("n1", 0)]))
        await events.wait_for(is_event("victim", K.EXECUTOR_EVENT_KIND_STARTED))
        foreign = tmp_path / "foreign"
        _foreign_checkpoint(foreign)
        cases = [
            (directive("b1", START, tiny_job("bad", model="no-such-net"), [gpu("n1", 1)]),
             "directive.job.model: unknown model 'no-such-net'"),
            (directive("b2", START, tiny_job("bad"), [gpu("n1", 0), gpu("n1", 1), gpu("n1", 2)]),
             "directive.gpus: 3 GPUs on node n1, which has only 2 slots"),
            (directive("b3", START, tiny_job("bad"), [gpu("n1", 7)]), "directive.gpus[0].index: 7 is out of range"),
            (directive("b5", START, tiny_job("bad"), [gpu("n1", 0)]), "n1:0 is held by job 'victim'"),
            (directive("b6", START, tiny_job("bad"), [gpu("n1", 1)], checkpoint_dir=str(foreign)),
             "directive.checkpoint_dir: checkpoint"),
            (directive("", START, tiny_job("bad"), [gpu("n1", 1)]), "directive.directive_id: is required"),
            (directive("b8", executor_pb2.DIRECTIVE_KIND_STOP, tiny_job("bad"), [gpu("n1", 1)]),
             "directive.kind: 3 is not START or RESIZE"),
            (directive("b9", START, tiny_job("bad", batch_size=0), [gpu("n1", 1)]), "directive.job.batch_size"),
            (directive("b10", START, tiny_job("bad"), []), "directive.gpus: at least one GPU is required"),
            (directive("b13", START, tiny_job("bad", max_gpus=1), [gpu("n1", 0), gpu("n1", 1)]),
             "directive.gpus: 2 ranks, but job bad runs on 1..1 GPUs"),
            (directive("b11", START, tiny_job("bad"), [gpu("n1", 1)],
                       profile=executor_pb2.ProfileOptions(measure_iters=-1)), "directive.profile.measure_iters"),
        ]
        for d, text in cases:
            await ex.start_job(d)
            refused = await events.wait_for(is_refusal_of(d), timeout=30)
            assert refused.job_id == "bad" and text in refused.message, (d.directive_id, refused.message)
        assert "holds model 'resnet18'" in next(e for e in events.items if is_refusal_of(cases[4][0])(e)).message
        # a move of the running job onto another model is refused too, and the job keeps its GPU
        move = directive("b12", RESIZE, tiny_job("victim", epochs=4, model="resnet18"), [gpu("n1", 0), gpu("n1", 1)])
        await ex.resize_job(move)
        refused = await events.wait_for(is_refusal_of(move), timeout=30)
        assert "directive.job: differs from the running job 'victim'" in refused.message

        await events.wait_for(is_event("victim", K.EXECUTOR_EVENT_KIND_FINISHED))
        assert [e.epoch for e in events.of("victim", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)] == [1, 2, 3, 4]
        assert [e.world_size for e in events.of("victim", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)] == [1] * 4
        assert all(e.kind == K.EXECUTOR_EVENT_KIND_FAILED and is_refusal(e.message) for e in events.of("bad"))
        assert len(events.of("victim", K.EXECUTOR_EVENT_KIND_STARTED)) == 1
        events.close()
