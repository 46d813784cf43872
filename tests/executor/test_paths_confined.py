"""A node's directives name its folders only under its roots (issue 24, item 4).

A checkpoint_dir outside the node's checkpoint root, or an imagefolder:/clips:
data set outside its data roots, after resolving '..' and symlinks, is refused
naming the field and the value (a FAILED event of the refused allocation):
nothing is written or run, and the node goes on serving. A data set error never lists a
folder's content. `omru up` gives its planner and executors one checkpoint root.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import grpc
import pytest

from omru import checkpoint
from omru.v1 import common_pb2, executor_pb2, executor_pb2_grpc, planner_pb2, planner_pb2_grpc
from services.common import config as cfg
from services.common.cluster import LocalCluster
from services.common.etcd import EtcdStore
from services.executor import server
from services.executor.worker import data
from services.executor.worker.spec import TrainSpec
from services.planner.state import PlannerState
from tests.executor.service_builders import K, START, allocate, directive, executors, gpu, is_event, is_refusal_of, tiny_job

NOT_UNDER_DATA_ROOTS = "is not under a data root of this node"


def layout(tmp_path):
    """root/ (the node's roots), root/link -> tmp_path/x (outside), and the outside folder's path."""
    root, outside = tmp_path / "root", tmp_path / "x"
    root.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    return root, outside


def refusals(root, outside):
    """(directive, the exact refusal) of every way out of the roots."""
    real = os.path.realpath(root)
    ckpt = f"is not under this node's checkpoint root {real!r}"
    data_roots = f"{NOT_UNDER_DATA_ROOTS} ({real!r})"
    video = dict(model="r3d_18", frames=2)
    cases = [
        (dict(checkpoint_dir=f"{root}/../x/y"), f"directive.checkpoint_dir: '{root}/../x/y' (resolved '{outside}/y') {ckpt}"),
        (dict(checkpoint_dir=f"{root}/link/y"), f"directive.checkpoint_dir: '{root}/link/y' (resolved '{outside}/y') {ckpt}"),
        (dict(checkpoint_dir="/etc"), f"directive.checkpoint_dir: '/etc' {ckpt}"),
        (dict(job=dict(dataset="imagefolder:/etc")), f"directive.job.dataset: 'imagefolder:/etc' {data_roots}"),
        # (/proc/self is the executor's process: this one, as the executors of these tests serve in-process)
        (dict(job=dict(dataset="clips:/proc/self", **video)),
         f"directive.job.dataset: 'clips:/proc/self' (resolved '/proc/{os.getpid()}') {data_roots}"),
        (dict(job=dict(dataset=f"imagefolder:{root}/link")),
         f"directive.job.dataset: 'imagefolder:{root}/link' (resolved '{outside}') {data_roots}"),
    ]
    return [(directive(f"bad-{i}", START, tiny_job("bad", **fields.get("job", {})), [gpu("n1", 0)],
                       checkpoint_dir=fields.get("checkpoint_dir", "")), text) for i, (fields, text) in enumerate(cases)]


async def test_folders_outside_the_roots_are_refused_naming_the_field_nothing_is_written_and_the_node_serves_on(
        registry, etcd_store, tmp_path):
    root, outside = layout(tmp_path)
    async with executors(registry.address, tmp_path, ("n1", 1), root=root, store=etcd_store) as (ex,):
        events = ex.events()
        for d, text in refusals(root, outside):
            d.attempt_id = f"{d.directive_id}-a1"
            await ex.start_job(d)
            failed = await events.wait_for(is_refusal_of(d), timeout=30)
            assert failed.message == f"directive {d.directive_id!r} refused: {text}"
            assert failed.attempt_id == d.attempt_id
        assert not outside.exists()
        assert not (tmp_path / "n1" / "jobs").exists()
        assert (await ex.stub.GetJobs(executor_pb2.GetJobsRequest(), timeout=10)).jobs == []
        # the node serves on: a job whose folders lie under the roots (through '..' that stays inside) trains
        ok = directive("ok", START, tiny_job("ok", epochs=1, train_samples=16),
                       [gpu("n1", 0)], checkpoint_dir=f"{root}/sub/../ckpt/ok")
        await ex.start_job(ok)
        await events.wait_for(is_event("ok", K.EXECUTOR_EVENT_KIND_FINISHED))
        assert [e for _, e in checkpoint.list_checkpoints(str(root / "ckpt" / "ok"))]
        assert all(e.kind == K.EXECUTOR_EVENT_KIND_FAILED for e in events.of("bad")) and not outside.exists()
        events.close()


def test_the_roots_come_from_flags_or_the_environment_resolved_and_default_to_the_planners_root(tmp_path):
    root, _ = layout(tmp_path)
    base = ["--registry", "127.0.0.1:1", "--node-id", "n"]
    default = server.parse_config(base, {})
    assert default.checkpoint_root == cfg.default_checkpoint_root().resolve() and default.data_roots == ()
    assert str(cfg.default_checkpoint_root()).endswith("omru-checkpoints")
    config = server.parse_config(base + ["--checkpoint-root", f"{root}/link"], {cfg.DATA_ROOTS_ENV: f"{root}::/srv"})
    assert config.checkpoint_root == tmp_path / "x" and config.data_roots == (root, Path("/srv"))
    assert server.parse_config(base + ["--data-roots", "/d"], {cfg.DATA_ROOTS_ENV: "/e"}).data_roots == (Path("/d"),)
    for kw, name in ((dict(checkpoint_root="ckpt"), "checkpoint_root 'ckpt'"), (dict(data_roots=("data",)), "data root 'data'")):
        with pytest.raises(cfg.ConfigError, match=f"^{name} is not an absolute path$"):
            cfg.ExecutorConfig(node_id="n", **kw)


@pytest.mark.parametrize("kind", ["imagefolder", "clips"])
def test_a_data_set_error_names_the_folder_and_never_its_content(tmp_path, kind):
    for name in ("secret-a", "secret-b"):
        (tmp_path / name).mkdir()
    (tmp_path / "secret-a" / "0.png").write_bytes(b"")
    (tmp_path / "secret-a" / "0.pt").write_bytes(b"")
    video = dict(model="r3d_18", frames=2) if kind == "clips" else {}
    with pytest.raises(data.DataError) as err:
        data.load(TrainSpec(job_id="j", model=video.get("model", "resnet18"), dataset=f"{kind}:{tmp_path}",
                            frames=video.get("frames", 0)))
    what = "not every class folder holds an image file (.jpg" if kind == "imagefolder" else "1 of its 2 class folders hold no .pt clips"
    assert str(err.value).startswith(f"data folder {str(tmp_path)!r}: {what}"), err.value
    assert "secret" not in str(err.value)


def test_omru_up_gives_its_planner_and_executors_one_checkpoint_root(tmp_path):
    job = tiny_job("up", epochs=1, train_samples=16, max_gpus=1)
    with LocalCluster(nodes=1, slots_per_node=1, planner_port=0, work_dir=tmp_path / "up", warm_workers=False) as up:
        root = os.path.realpath(tmp_path / "up" / "checkpoints")
        outside = directive("d", START, tiny_job("outside", epochs=1), [gpu("node-0", 0)],
                            checkpoint_dir=str(tmp_path / "y"), attempt_id="outside-a1")

        async def allocation(write: bool):  # written as the planner writes it, then gone with its claim
            async with EtcdStore(up.etcd_endpoint) as store:
                if write:
                    await allocate(store, "node-0", outside)
                else:
                    await PlannerState(store).change("outside", drop=["node-0"], release=[("node-0", 0)])

        asyncio.run(allocation(write=True))
        with grpc.insecure_channel(up.executors[0].address) as channel:
            events = executor_pb2_grpc.ExecutorServiceStub(channel).WatchEvents(executor_pb2.WatchEventsRequest(), timeout=60)
            failed = next(r.event for r in events if r.event.job_id == "outside")
            events.cancel()
        asyncio.run(allocation(write=False))
        assert failed.message == (f"directive 'd' refused: directive.checkpoint_dir: {str(tmp_path / 'y')!r} is not "
                                  f"under this node's checkpoint root {root!r}")
        # what the planner sends runs: its checkpoint folders lie under the same root
        with grpc.insecure_channel(up.service("planner").address) as channel:
            planner = planner_pb2_grpc.PlannerServiceStub(channel)
            planner.SubmitJobs(planner_pb2.SubmitJobsRequest(
                jobs=[job], profiles=[planner_pb2.JobProfile(job_id="up", epoch_seconds={1: 5.0})]), timeout=30)
            deadline, state = time.monotonic() + 180, None
            while time.monotonic() < deadline and state not in (common_pb2.JOB_STATE_FINISHED, common_pb2.JOB_STATE_FAILED):
                time.sleep(0.5)
                jobs = planner.ListJobs(planner_pb2.ListJobsRequest(job_ids=["up"]), timeout=10).jobs
                state, message = (jobs[0].state, jobs[0].message) if jobs else (None, "")
        assert state == common_pb2.JOB_STATE_FINISHED, message
        assert list((tmp_path / "up" / "checkpoints").glob("*/up/epoch-*.pt"))
