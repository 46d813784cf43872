"""The SDK (omru.client): its own errors (omru.errors) for what the services answer, wait() with a timeout,
nodes() from the registry, the job builder, TlsConfig from omru, and a client that never imports torch.

Real etcd, registry and planner (in process, port 0); no executor, so submitted jobs stay pending unless
cancelled. (The documented example against a whole cluster: test_sdk_example.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

from omru import errors
from omru.client import Client, SyncClient, job
from services.common.cluster import child_env
from tests.conftest import start_registry
from tests.platform.platform_helpers import claim, register_request
from tests.planner_service.planner_helpers import planner

TINY = dict(model="mobilenet_v3_small", dataset="synthetic", num_classes=4, image_size=16, train_samples=64,
            batch_size=8, base_batch=8, max_gpus=1, profile={1: 3.0})


def blocked_python(code: str, env: dict | None = None, blocked=("torch", "torchvision", "numpy", "scipy", "sklearn",
                                                                   "matplotlib")) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter where importing any of `blocked` raises ImportError."""
    prelude = textwrap.dedent(f"""\
        import sys
        class _Blocked:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {tuple(blocked)!r}:
                    raise ImportError(f"{{name}} is blocked in this test")
        sys.meta_path.insert(0, _Blocked())
        """)
    return subprocess.run([sys.executable, "-c", prelude + code], env=child_env(env), capture_output=True, text=True,
                          timeout=120)


async def test_every_error_of_the_planner_is_an_sdk_error_keeping_its_code_and_details(etcd, registry):
    async with planner(etcd.endpoint, registry.address) as (running, _d, _stub):
        async with Client(running.address) as c:
            with pytest.raises(errors.NotFound) as err:
                await c.cancel("ghost")
            assert err.value.code() == grpc.StatusCode.NOT_FOUND and "'ghost'" in err.value.details()
            assert err.value.address == running.address and str(err.value) == f"{err.value.details()} ({running.address})"
            assert isinstance(err.value, errors.OmruError) and not isinstance(err.value, grpc.aio.AioRpcError)

            with pytest.raises(errors.InvalidArgument) as err:  # the planner's check
                await c.list_jobs(states=[99])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "states[0]: 99" in err.value.details()
            with pytest.raises(errors.InvalidArgument, match="unknown job state 'bogus'"):  # the SDK's own, first
                await c.list_jobs(states=["bogus"])
            with pytest.raises(errors.InvalidArgument) as err:  # a bad spec the planner refuses, named
                await c.submit(_bad_spec())
            assert "job_id" in err.value.details() and "'bad id'" in err.value.details(), err.value.details()
            with pytest.raises(errors.InvalidArgument, match=r"jobs\[0\]: 'resnet18' is not a job"):
                await c.submit(["resnet18"])
            with pytest.raises(errors.InvalidArgument, match=r"jobs: 'resnet18' is not a job or a list of jobs"):
                await c.submit("resnet18")
            with pytest.raises(errors.NotFound, match="ghost"):  # streams too
                async for _ in c.logs("ghost"):
                    pass
            with pytest.raises(errors.InvalidArgument, match="timeout_s: -1 is not a number of seconds > 0"):
                async for _ in c.watch(timeout_s=-1):
                    pass


def _bad_spec():
    from omru.v1 import common_pb2

    return common_pb2.JobSpec(job_id="bad id", model="resnet18", dataset="digits", epochs=1)


async def test_wait_returns_the_final_states_names_unknown_jobs_and_times_out_with_the_last_states(etcd, registry):
    async with planner(etcd.endpoint, registry.address) as (running, _d, _stub):
        async with Client(running.address) as c:
            assert await c.submit([job("a", epochs=2, **TINY), job("b", epochs=2, **TINY)]) == ["a", "b"]
            # nothing runs them (no executor): they stay pending or waiting, and wait() gives up when told to
            began = time.monotonic()
            with pytest.raises(errors.WaitTimeout) as err:
                await c.wait(["a", "b"], timeout=1.0)
            assert 0.9 < time.monotonic() - began < 5
            assert isinstance(err.value, errors.DeadlineExceeded) and err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            states = {j: s.state for j, s in err.value.states.items()}
            assert list(states) == ["a", "b"] and set(states.values()) <= {"PENDING", "WAITING"}, states
            assert f"jobs not done within 1.0 s: a {states['a']}, b {states['b']}" in err.value.details()

            with pytest.raises(errors.NotFound, match="no job 'ghost', 'ghost2' on the planner"):
                await c.wait(["a", "ghost", "ghost2"], timeout=5)
            for bad, text in [((["a"], 0), "timeout: 0 is not a number of seconds > 0"),
                              ((["a"], float("nan")), "timeout: nan is not"), (([], 5), "job_ids: no job id given"),
                              (([""], 5), "job_ids[0]: '' is not a job id")]:
                with pytest.raises(errors.InvalidArgument, match=text.replace("[", r"\[").replace("]", r"\]")):
                    await c.wait(*bad)

            # a job that ends while wait() waits: its final state comes back, in the order asked
            waiting = asyncio.ensure_future(c.wait(["b", "a"], timeout=30))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            assert await c.cancel("a") == "CANCELLED"
            await asyncio.sleep(0.3)
            assert not waiting.done()  # b still pending
            await c.cancel("b")
            final = await asyncio.wait_for(waiting, 10)
            assert list(final) == ["b", "a"] and {s.state for s in final.values()} == {"CANCELLED"}
            assert await c.wait("a", timeout=1) == {"a": final["a"]}  # ended already: at once


async def test_nodes_lists_each_node_its_gpus_and_the_job_holding_each(etcd, registry, registry_stub, etcd_store,
                                                                      free_port):
    await registry_stub.RegisterNode(register_request("n1", slots=2, ttl=30, port=free_port()), timeout=10)
    await registry_stub.RegisterNode(register_request("n2", slots=1, ttl=30, port=free_port()), timeout=10)
    assert (await claim(etcd_store, "job-x", ("n1", 1))).succeeded
    async with Client("127.0.0.1:1", registry=registry.address) as c:  # (no planner needed for nodes)
        nodes = {n.node_id: n for n in await c.nodes()}
    assert sorted(nodes) == ["n1", "n2"]
    assert [(g.index, g.kind, g.job_id) for g in nodes["n1"].gpus] == [(0, "cpu", ""), (1, "cpu", "job-x")]
    assert nodes["n1"].ttl_seconds == 30 and nodes["n1"].address.startswith("127.0.0.1:")
    assert abs(nodes["n2"].registered_unix_s - time.time()) < 60

    # the registry from $OMRU_REGISTRY; none known at all: Unavailable saying how to give one
    with SyncClient("127.0.0.1:1") as sc:
        with pytest.raises(errors.Unavailable, match=r"no registry address: pass one, set \$OMRU_REGISTRY"):
            sc.nodes()


async def test_a_token_the_registry_refuses_is_unauthenticated_and_the_right_one_gets_in(etcd):
    server = await start_registry(etcd.endpoint, auth_token="s3cret-token")
    try:
        async with Client("127.0.0.1:1", token="guess", registry=server.address) as c:
            with pytest.raises(errors.Unauthenticated) as err:
                await c.nodes()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and err.value.address == server.address
        async with Client("127.0.0.1:1", token="s3cret-token", registry=server.address) as c:
            assert await c.nodes() == []
    finally:
        await server.stop(0)


def test_an_unreachable_planner_is_unavailable_naming_its_address_and_bad_settings_are_named(free_port):
    address = f"127.0.0.1:{free_port()}"
    with SyncClient(address, deadline_s=2) as c:
        with pytest.raises(errors.Unavailable) as err:
            c.status()
    assert err.value.address == address and address in str(err.value)
    for kwargs, text in [({"deadline_s": 0}, "deadline_s: 0 is not a number of seconds > 0"),
                         ({"deadline_s": "5"}, "deadline_s: '5' is not"), ({"deadline_s": None}, "deadline_s: None is not")]:
        with pytest.raises(errors.InvalidArgument, match=text):
            Client(address, **kwargs)


def test_job_builds_a_validated_job_and_names_every_bad_value():
    j = job("a", model="resnet18", epochs=3, max_gpus=2, profile={1: 4.0, 2: 2.5}, seed=5)
    assert (j.id, j.spec.model, j.spec.epochs, j.max_gpus, dict(j.profile), j.spec.seed) == \
        ("a", "resnet18", 3, 2, {1: 4.0, 2: 2.5}, 5)
    script = job("s", command=("python", "train.py"), env={"SEED": "1"}, epochs=1)
    assert script.spec.command == ("python", "train.py") and dict(script.spec.env) == {"SEED": "1"}
    with pytest.raises(errors.InvalidArgument) as err:
        job("a", model="nosuch", epochs=0, colour="red")
    text = str(err.value)
    assert "unknown field 'colour'" in text and "epochs: must be >= 1, got 0" in text and "'nosuch'" in text
    assert isinstance(err.value, ValueError)


def test_the_client_imports_and_runs_without_torch_and_tls_config_comes_from_omru(etcd, tmp_path):
    """In a fresh interpreter where torch (and numpy, scipy, sklearn, matplotlib) cannot be imported."""
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked until a channel opens\n")
    code = textwrap.dedent(f"""\
        import omru, omru.client, omru.errors
        from omru import TlsConfig, workload
        from omru.client import SyncClient, job
        tls = TlsConfig(ca_file={str(ca)!r})
        w = workload.parse("jobs:\\n  - id: w\\n    model: resnet18\\n    epochs: 2\\n    profile: {{1: 3.0}}\\n")
        j = job("j", model="resnet18", epochs=1, profile={{1: 3.0}})
        with SyncClient("127.0.0.1:1", deadline_s=2) as c:
            try:
                c.submit([w.jobs[0], j])
            except omru.errors.Unavailable as exc:
                print("unavailable", exc.code().name)
        print(type(tls).__name__, sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
        """)
    done = blocked_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["unavailable UNAVAILABLE", "TlsConfig []"], done.stdout
    # the blocker works: the same interpreter cannot import torch
    assert "torch is blocked in this test" in blocked_python("import torch").stderr


async def test_the_client_runs_without_the_servers_libraries_when_it_builds_no_workload(etcd, registry):
    """What a client-only install would lack (etcd client, logging, metrics, numerics, torch) is never
    imported by the calls, against a real planner and registry; only building jobs from a workload does."""
    blocked = ("torch", "torchvision", "numpy", "scipy", "sklearn", "matplotlib", "aetcd", "structlog",
               "prometheus_client", "pynvml")
    async with planner(etcd.endpoint, registry.address) as (running, _d, _stub):
        code = textwrap.dedent(f"""\
            from omru import errors
            from omru.client import SyncClient
            from omru.v1 import common_pb2
            with SyncClient({running.address!r}, registry={registry.address!r}) as c:
                spec = common_pb2.JobSpec(job_id="p", model="mobilenet_v3_small", dataset="synthetic", num_classes=4,
                                          image_size=16, train_samples=64, epochs=1, batch_size=8, base_batch=8,
                                          base_lr=0.05, min_gpus=1, max_gpus=1)
                print(c.submit(spec), [j.state for j in c.status()], c.nodes(), c.cancel("p"))
                print({{j: s.state for j, s in c.wait(["p"], timeout=10).items()}})
                try:
                    c.cancel("ghost")
                except errors.NotFound as exc:
                    print(type(exc).__name__, exc.details())
            """)
        done = await asyncio.to_thread(blocked_python, code, blocked=blocked)
    assert done.returncode == 0, done.stderr
    first, second, third = done.stdout.splitlines()
    assert first.startswith("['p'] [") and first.endswith("] [] CANCELLED"), first
    assert second == "{'p': 'CANCELLED'}" and third == "NotFound job_id 'ghost' not found", done.stdout
