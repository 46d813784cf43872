"""No silent input loss: every field is honoured exactly or refused naming the
field and the bad value (INVALID_ARGUMENT; the CLI: exit code 2), with the
echoed value cut short; nothing of a refused request is stored."""

from __future__ import annotations

import grpc
import pytest

from omru import workload
from omru.cli.main import main as omru_main
from omru.spec import MAX_GPUS_PER_NODE, SpecError, shown
from omru.v1 import common_pb2, executor_pb2, planner_pb2, profiler_pb2, registry_pb2
from omru.workload import WorkloadError
from platform_helpers import register_request, rpc_error
from services.common.errors import MAX_MESSAGE, bounded
from services.executor import convert as executor_convert
from services.executor.supervisor import DirectiveError
from services.planner import convert as planner_convert
from tests.planner_service.planner_helpers import node_request, planner, spec
from tests.profiler.profiler_helpers import profiler, tiny_job

INVALID = grpc.StatusCode.INVALID_ARGUMENT
MB = "a" * (1 << 20)
#: A 1 MB value echoed: its first 64 characters, then its length.
MB_SHOWN = f"'{'a' * 64}'...(1048576 chars)"


def test_shown_cuts_long_values_and_counts_them():
    assert shown("abc") == "'abc'"
    assert shown(MB) == MB_SHOWN
    assert shown(list(range(100))).endswith("...(390 chars)") and len(shown(list(range(100)))) < 90
    message = "x: " + "é" * 5000
    assert len(bounded(message).encode()) <= MAX_MESSAGE and bounded(message).endswith("...(5003 chars)")
    assert bounded("short") == "short"


def _nodes(nodes: registry_pb2.ListNodesResponse) -> list:
    return [(n.node_id, len(n.gpus)) for n in nodes.nodes]


async def test_registry_bounds_gpus_per_node_kinds_and_ids_and_stores_nothing_refused(registry_stub, etcd_store):
    await registry_stub.RegisterNode(register_request("node-a", slots=2, ttl=60))
    before = await etcd_store.revision()

    many = register_request("node-b", slots=100_000, ttl=60)
    error = await rpc_error(registry_stub.RegisterNode(many))
    assert (error.code(), error.details()) == (INVALID, "gpus: 100000 GPUs, at most 256 per node")

    long_kind = register_request("node-c", ttl=60)
    long_kind.gpus[0].kind = MB
    error = await rpc_error(registry_stub.RegisterNode(long_kind))
    assert (error.code(), error.details()) == (INVALID, f"gpus[0].kind: {MB_SHOWN} is longer than 255 characters")

    high_index = register_request("node-d", ttl=60)
    high_index.gpus[1].index = MAX_GPUS_PER_NODE
    error = await rpc_error(registry_stub.RegisterNode(high_index))
    assert (error.code(), error.details()) == (INVALID, "gpus[1].index: 256 is not in 0..255")

    long_address = register_request("node-e", ttl=60)
    long_address.address = "h" * 300 + ":4000"
    error = await rpc_error(registry_stub.RegisterNode(long_address))
    assert error.code() == INVALID and error.details().startswith("address: 'hhhh") and "(305 chars)" in error.details()

    for call in (registry_stub.GetNode(registry_pb2.GetNodeRequest(node_id=MB)),
                 registry_stub.ListClaims(registry_pb2.ListClaimsRequest(job_id=MB))):
        error = await rpc_error(call)
        assert error.code() == INVALID, error.details()
        assert MB_SHOWN in error.details() and len(error.details()) < 300

    assert await etcd_store.revision() == before
    assert _nodes(await registry_stub.ListNodes(registry_pb2.ListNodesRequest())) == [("node-a", 2)]

    await registry_stub.RegisterNode(register_request("node-f", slots=MAX_GPUS_PER_NODE, ttl=60))  # the limit itself
    assert ("node-f", 256) in _nodes(await registry_stub.ListNodes(registry_pb2.ListNodesRequest()))


async def _refused(call) -> str:
    error = await rpc_error(call)
    assert error.code() == INVALID, error.details()
    return error.details()


async def test_planner_refuses_what_it_would_lose_or_change_and_stores_nothing(etcd, registry, registry_stub, etcd_store,
                                                                              free_port):
    await registry_stub.RegisterNode(node_request("n0", 2, free_port()))
    async with planner(etcd.endpoint, registry.address) as (_, d, stub):
        def submit(*jobs, profiles=()):
            return stub.SubmitJobs(planner_pb2.SubmitJobsRequest(jobs=jobs, profiles=profiles), timeout=10)

        assert await _refused(submit(spec("mm", min_gpus=2, max_gpus=1))) == \
            "jobs[0] ('mm'): max_gpus: 1 is below min_gpus (2)"
        assert await _refused(submit(spec("neg", max_gpus=-3))) == \
            "jobs[0] ('neg'): max_gpus: -3 is negative (0 = any number)"
        assert await _refused(submit(spec("lr", base_lr=float("inf")))) == \
            "jobs[0] ('lr'): base_lr: inf is not a finite number"
        assert await _refused(submit(spec(MB))) == \
            f"jobs[0] ({MB_SHOWN}): job_id: {MB_SHOWN} is not a valid id ([A-Za-z0-9._-], 1..128 characters, " \
            "not starting with . _ -)"
        assert await _refused(submit(spec("w", workdir="/" + MB))) == \
            f"jobs[0] ('w'): workdir: '/{'a' * 63}'...(1048577 chars) is longer than 4096 characters"
        assert await _refused(submit(spec("p"), profiles=[planner_pb2.JobProfile(job_id="q", epoch_seconds={1: 3.0})])) \
            == "profiles[0].job_id: 'q' is not the job_id of any of jobs"
        twice = [planner_pb2.JobProfile(job_id="p", epoch_seconds={1: 3.0}), planner_pb2.JobProfile(job_id="p", epoch_seconds={1: 4.0})]
        assert await _refused(submit(spec("p"), profiles=twice)) == "profiles[1].job_id: 'p' has a profile already"
        assert "profile: inf seconds per epoch on 1 GPUs" in await _refused(
            submit(spec("p"), profiles=[planner_pb2.JobProfile(job_id="p", epoch_seconds={1: float("inf")})]))
        many = await _refused(submit(*(spec(f"j{i}", model="m" * 200) for i in range(300))))
        assert many.startswith("jobs[0] ('j0'): model: unknown model") and len(many.encode()) <= MAX_MESSAGE
        assert many.endswith(" chars)")

        assert MB_SHOWN in await _refused(stub.CancelJob(planner_pb2.CancelJobRequest(job_id=MB), timeout=5))
        assert await _refused(stub.WatchJobs(planner_pb2.WatchJobsRequest(job_ids=["ok", "bad id"]), timeout=5).read()) \
            == "job_ids[1]: 'bad id' is not a valid id ([A-Za-z0-9._-], 1..128 characters, not starting with . _ -)"
        kvs, _ = await etcd_store.list("planner/jobs/")
        assert kvs == []

        await submit(spec("ok", min_gpus=1, max_gpus=2, warmup_epochs=2))  # honoured exactly
        stored = await d.state.job("ok")
        assert (stored.max_gpus, stored.spec["min_gpus"], stored.spec["warmup_epochs"], stored.spec["lr_decay"]) == (2, 1, 2, "none")


async def test_profiler_refuses_long_fields_as_invalid_argument_not_unavailable(etcd, registry):
    async with profiler(etcd.endpoint, registry.address) as stub:
        for request, field in (
                (profiler_pb2.GetProfileRequest(job=tiny_job(dataset="imagefolder:/" + MB)), "job.dataset"),
                (profiler_pb2.GetProfileRequest(job=tiny_job(model=MB)), "job.model"),
                (profiler_pb2.GetProfileRequest(job=tiny_job(job_id=MB)), "job.job_id"),
                (profiler_pb2.GetProfileRequest(job=tiny_job(), gpu_kind=MB), "gpu_kind"),
                (profiler_pb2.GetProfileRequest(job=tiny_job(command=["python", MB], model="", dataset="")), "job.command[1]")):
            details = await _refused(stub.GetProfile(request, timeout=10))
            assert details.startswith(f"{field}: ") and "(10485" in details and len(details) < 300, details
        details = await _refused(stub.Profile(profiler_pb2.ProfileRequest(job=tiny_job(env={"X": MB}, model="", dataset="",
                                                                                       command=["python"])), timeout=10).read())
        assert details == f"job.env[X]: {MB_SHOWN} is longer than 4096 characters"


def test_executor_directives_are_bounded_naming_the_field():
    job = common_pb2.JobSpec(job_id="j", model="resnet18", dataset="digits", epochs=1, batch_size=8, base_lr=0.1)
    d = executor_pb2.Directive(directive_id="d1", kind=executor_pb2.DIRECTIVE_KIND_START, job=job,
                               gpus=[common_pb2.GpuRef(node_id="n", index=0)], checkpoint_dir="/" + MB)
    with pytest.raises(DirectiveError) as err:
        executor_convert.directive(d)
    assert err.value.field == "directive.checkpoint_dir"
    d.checkpoint_dir, d.job.max_gpus, d.job.min_gpus = "/ckpt", 1, 2
    with pytest.raises(DirectiveError) as err:
        executor_convert.directive(d)
    assert str(err.value) == "directive.job.max_gpus: 1 is below min_gpus (2)"


def test_the_sdk_cannot_submit_what_the_job_spec_would_lose():
    from services.executor.worker.spec import TrainSpec

    job = workload.WorkloadJob(spec=TrainSpec(job_id="a", model="resnet18", lr_decay="cosine"))
    with pytest.raises(SpecError) as err:
        planner_convert.job_spec(job)
    assert err.value.field == "lr_decay"


JOB = "jobs:\n  - id: a\n    model: resnet18\n    epochs: 3\n"


@pytest.mark.parametrize("extra, problem", [
    ("    lr_decay: cosine\n", "job 'a': lr_decay: 'cosine' cannot be submitted: the cluster's JobSpec has no lr_decay"),
    ("    warmup_epochs: 2.5\n", "job 'a': warmup_epochs: must be a whole number of epochs to be submitted "
                                 "(JobSpec counts whole epochs), got 2.5"),
    ("    epochs: 4\n", "line 5: key 'epochs' given twice in one mapping (first on line 4)"),
    ("    train_samples: 3000000000\n", "job 'a': train_samples: must be below 2**31 to fit the JobSpec, got 3000000000"),
    ("    min_gpus: 2\n    max_gpus: 1\n", "job 'a': max_gpus: must be >= min_gpus (2), got 1"),
    ("    dataset: imagefolder:/" + "d" * 5000 + "\n", "job 'a': dataset: 'imagefolder:/ddd"),
])
def test_a_workload_field_that_would_be_lost_is_refused_naming_it(extra, problem):
    with pytest.raises(WorkloadError) as err:
        workload.parse(JOB + extra)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(problem), err.value.problems


def test_duplicate_keys_are_found_in_every_mapping_but_a_merged_key_may_be_overridden():
    text = "defaults: &d\n  epochs: 2\n  epochs: 3\njobs:\n  - <<: *d\n    id: a\n    model: resnet18\n    epochs: 4\n    id: b\n"
    with pytest.raises(WorkloadError) as err:
        workload.parse(text)
    assert err.value.problems == ["line 3: key 'epochs' given twice in one mapping (first on line 2)",
                                  "line 9: key 'id' given twice in one mapping (first on line 6)"]
    w = workload.parse("defaults: &d\n  epochs: 2\njobs:\n  - <<: *d\n    id: a\n    model: resnet18\n    epochs: 4\n"
                       "    warmup_epochs: 2.0\n")
    assert (w.jobs[0].spec.epochs, planner_convert.job_spec(w.jobs[0]).warmup_epochs) == (4, 2)


def test_omru_submit_refuses_a_bad_workload_with_exit_code_2(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    path.write_text(JOB + "    lr_decay: cosine\n    warmup_epochs: 0.5\n")
    # (no planner at this address: the file is refused before any call)
    assert omru_main(["submit", str(path), "--planner", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("omru submit: error: ") and "lr_decay: 'cosine'" in err
