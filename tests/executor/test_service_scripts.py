"""Script jobs on a real executor: a user's own training code (a plain torchrun-style
script and one that uses omru.elastic, both from examples/) runs every epoch,
resizes through its checkpoint, fails with its exception as the reason, and
leaves logs that the executor serves over gRPC and `omru logs` prints."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from omru.v1 import executor_pb2
from tests.executor.service_builders import (K, RESIZE, START, directive, executors, gpu, is_event, is_refusal_of,
                                             start_executor, tiny_job)
from tests.platform.platform_helpers import rpc_error

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def script_job(job_id: str, script: str, *args: str, **fields):
    """A job running examples/<script> (small data: an epoch takes well under a second)."""
    fields = {"epochs": 2, "batch_size": 16, "base_lr": 0.05, "base_batch": 16, "model": "", "dataset": "",
              "num_classes": 0, "image_size": 0, "train_samples": 0, "seed": 0, "workdir": str(REPO), **fields}
    return tiny_job(job_id, command=["python", f"examples/{script}", *args], **fields)


async def logs(ex, job_id: str, **fields) -> list[executor_pb2.GetLogsResponse]:
    request = executor_pb2.GetLogsRequest(job_id=job_id, **fields)
    return [c async for c in ex.stub.GetLogs(request, timeout=30)]


def omru(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "omru", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV, **kwargs)


async def test_a_plain_torchrun_script_runs_every_epoch_and_its_logs_are_served_after_the_executor_restarts(
        registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2), store=etcd_store) as (ex,):
        events = ex.events()
        job = script_job("plain", "train_ddp.py", "--epochs", "3", "--samples", "512", epochs=3)
        await ex.start_job(directive("d1", START, job, [gpu("n1", 0), gpu("n1", 1)]))
        finished = await events.wait_for(is_event("plain", K.EXECUTOR_EVENT_KIND_FINISHED))
        assert (finished.epoch, finished.world_size) == (3, 2)
        started = events.of("plain", K.EXECUTOR_EVENT_KIND_STARTED)
        assert len(started) == 1 and "MASTER 127.0.0.1:" in started[0].message
        await events.wait_for(is_event("plain", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))
        assert (await ex.job("plain")).phase == "finished"
        events.close()
    # a new executor on the same work folder serves the finished job's logs
    ex = await start_executor(registry.address, "n1", 2, tmp_path / "n1")
    try:
        chunks = await logs(ex, "plain")
        assert ("n1", 1, 0) in {(c.node_id, c.attempt, c.rank) for c in chunks} <= {("n1", 1, 0), ("n1", 1, 1)}
        text = b"".join(c.data for c in chunks if c.rank == 0).decode()
        assert [line.split(" loss ")[0] for line in text.splitlines() if line.startswith("epoch ")] == [
            "epoch 1/3", "epoch 2/3", "epoch 3/3"]
        assert "@omru-record" not in text
        tail = await logs(ex, "plain", rank=0, offset=len(text.encode()) - 8)
        assert b"".join(c.data for c in tail).decode() == text[-8:]

        cli = omru("logs", "plain", "--registry", registry.address)
        out, err = await asyncio.to_thread(cli.communicate, timeout=60)
        assert cli.returncode == 0, err
        assert "[n1 rank 0] epoch 3/3 loss" in out

        invalid, missing = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
        for fields, code, text in [
            ({"job_id": "../n1"}, invalid, "job_id"), ({"job_id": ""}, invalid, "job_id: is required"),
            ({"job_id": "plain", "attempt": -1}, invalid, "attempt: -1 is negative"),
            ({"job_id": "plain", "rank": -2}, invalid, "rank: -2 is negative"),
            ({"job_id": "plain", "offset": -5}, invalid, "offset: -5 is negative"),
            ({"job_id": "plain", "attempt": 2}, missing, "has attempts 1..1 on this node, not 2"),
            ({"job_id": "plain", "rank": 5}, missing, "ran ranks [0, 1] on this node, not 5"),
            ({"job_id": "ghost"}, missing, "no logs of job 'ghost'"),
        ]:
            err = await rpc_error(logs(ex, **fields))
            assert err.code() == code and text in err.details(), (fields, err.details())
        cli = omru("logs", "ghost", "--registry", registry.address)
        out, err = await asyncio.to_thread(cli.communicate, timeout=60)
        assert cli.returncode == 2 and "no logs of job 'ghost' on any node" in err
    finally:
        await ex.channel.close()
        await ex.running.stop(0)


async def test_an_elastic_script_resized_from_one_to_two_slots_scales_its_lr_by_two_and_trains_each_epoch_once(
        registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2), store=etcd_store) as (ex,):
        events = ex.events()
        job = script_job("elastic", "train_script.py", "--samples", "8192", epochs=4)
        await ex.start_job(directive("d1", START, job, [gpu("n1", 0)]))
        await events.wait_for(is_event("elastic", K.EXECUTOR_EVENT_KIND_STARTED))  # (its logs exist)
        follow = omru("logs", "elastic", "--follow", "--rank", "0", "--registry", registry.address)
        await events.wait_for(is_event("elastic", K.EXECUTOR_EVENT_KIND_EPOCH_DONE, epoch=1))
        await ex.resize_job(directive("d2", RESIZE, job, [gpu("n1", 0), gpu("n1", 1)]))
        await events.wait_for(is_event("elastic", K.EXECUTOR_EVENT_KIND_FINISHED))
        done = events.of("elastic", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)
        assert [e.epoch for e in done] == [1, 2, 3, 4]  # every epoch once, none twice
        sizes = [e.world_size for e in done]
        assert sizes[0] == 1 and sizes[-1] == 2 and sizes == sorted(sizes)
        lrs = {e.world_size: e.lr for e in done}
        assert lrs == {1: pytest.approx(0.05), 2: pytest.approx(0.1)}  # linear scaling rule: global batch x 2
        assert all(e.global_batch == 16 * e.world_size and e.steps > 0 and e.loss > 0 for e in done)
        assert [e.epoch for e in events.of("elastic", K.EXECUTOR_EVENT_KIND_STARTED)] == [0, done[sizes.index(2)].epoch - 1]

        # --follow printed the first attempt as it ran and ended with it
        out, err = await asyncio.to_thread(follow.communicate, timeout=60)
        assert follow.returncode == 0, err
        assert "epoch 1/4" in out and "world 1" in out and "world 2" not in out
        second = b"".join(c.data for c in await logs(ex, "elastic", rank=0)).decode()
        assert "rank 0: resumed at epoch" in second and "world 2" in second
        events.close()


async def test_a_script_that_raises_fails_with_its_exception_and_is_not_retried_the_same_way_again(
        registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2), max_restarts=5, store=etcd_store) as (ex,):
        events = ex.events()
        job = script_job("broken", "train_script.py", "--fail", "disk full at /data/x")
        await ex.start_job(directive("d1", START, job, [gpu("n1", 0)]))
        failed = await events.wait_for(is_event("broken", K.EXECUTOR_EVENT_KIND_FAILED))
        assert "rank 0 exited with code 1" in failed.message and "[rank0]" not in failed.message
        assert "RuntimeError: disk full at /data/x" in failed.message
        assert "raise RuntimeError(args.fail)" in failed.message  # the last lines of its stderr
        assert "the same way twice" in failed.message
        assert len(events.of("broken", K.EXECUTOR_EVENT_KIND_STARTED)) == 2  # one retry, not max_restarts
        assert (await ex.job("broken")).phase == "failed"
        events.close()


async def test_a_bad_script_job_is_refused_naming_the_field_and_nothing_starts(registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 1), store=etcd_store) as (ex,):
        events = ex.events()
        cases = [
            (script_job("bad", "train_ddp.py", workdir=str(tmp_path / "nowhere")),
             f"directive.job.workdir: '{tmp_path / 'nowhere'}' is not a folder on node n1"),
            (script_job("bad", "train_ddp.py", workdir="relative/dir"), "directive.job.workdir: must be an absolute"),
            (script_job("bad", "train_ddp.py", model="resnet18"), "directive.job.model: a script job"),
            (script_job("bad", "train_ddp.py", dataset="digits"), "directive.job.dataset: a script job"),
            (tiny_job("bad", command=["python", ""]), "directive.job.command: must be a list of non-empty strings"),
            (script_job("bad", "train_ddp.py", env={"RANK": "3"}), "directive.job.env: RANK is set by the executor"),
            (tiny_job("bad", model=""), "directive.job.model: is required"),
        ]
        for i, (job, text) in enumerate(cases):
            d = directive(f"b{i}", START, job, [gpu("n1", 0)])
            await ex.start_job(d)
            refused = await events.wait_for(is_refusal_of(d), timeout=30)
            assert text in refused.message, (i, refused.message)
        assert (await ex.stub.GetJobs(executor_pb2.GetJobsRequest(), timeout=10)).jobs == []
        assert not (tmp_path / "n1" / "logs").exists()
        events.close()


async def test_a_profiling_trial_of_an_elastic_script_times_its_iterations_and_a_plain_script_is_told_why_not(
        registry, etcd_store, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2), store=etcd_store) as (ex,):
        events = ex.events()
        trial = executor_pb2.ProfileOptions(warmup_iters=2, measure_iters=5)
        await ex.start_job(directive("p1", START, script_job("timed", "train_script.py", epochs=50),
                                     [gpu("n1", 0), gpu("n1", 1)], profile=trial))
        profiled = await events.wait_for(is_event("timed", K.EXECUTOR_EVENT_KIND_PROFILED))
        assert profiled.world_size == 2 and profiled.global_batch == 32 and profiled.iter_seconds > 0
        assert profiled.steps == (2048 - 256) // 32 and profiled.epoch_seconds == pytest.approx(
            profiled.iter_seconds * profiled.steps)
        assert "sampled: 5 iterations after 2 warm-up" in profiled.message
        assert not events.of("timed", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)  # timed iterations, no epoch trained
        await events.wait_for(is_event("timed", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))

        await ex.start_job(directive("p2", START, script_job("plain", "train_ddp.py", "--epochs", "1", "--samples", "64"),
                                     [gpu("n1", 0)], profile=trial))
        failed = await events.wait_for(is_event("plain", K.EXECUTOR_EVENT_KIND_FAILED))
        assert "without timing its iterations" in failed.message and "ctx.batches" in failed.message
        events.close()
