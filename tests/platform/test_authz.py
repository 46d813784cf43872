"""Who may call what (services/common/authz.py), against real servers on real etcd: the table row by row
for every caller kind, users' own jobs, node certificates under mutual TLS, and the tokens file's errors."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from omru.v1 import (common_pb2, executor_pb2, executor_pb2_grpc, planner_pb2, planner_pb2_grpc, profiler_pb2, profiler_pb2_grpc,
                     registry_pb2, registry_pb2_grpc)
from platform_helpers import etcd_http_range, register_request
from services.common import authz
from services.common import config as cfg
from services.common.authz import Principal
from services.common.channels import open_channel
from services.common.etcd import EtcdStore, EtcdUnavailable

ROOT = Path(__file__).resolve().parents[2]
#: caller kind -> its token ("none": no credential)
TOKENS = {"user": "tok-alice", "other user": "tok-bob", "admin": "tok-root", "planner": "tok-planner",
          "profiler": "tok-profiler", "this node": "tok-n1", "another node": "tok-n2"}
TABLE = {"tok-alice": Principal(authz.USER, "alice"), "tok-bob": Principal(authz.USER, "bob"),
         "tok-root": Principal(authz.ADMIN, "root"), "tok-planner": Principal(authz.PLANNER, "planner"),
         "tok-profiler": Principal(authz.PROFILER, "profiler"), "tok-registry": Principal(authz.REGISTRY, "registry"),
         "tok-n1": Principal(authz.NODE, "n1"), "tok-n2": Principal(authz.NODE, "n2"),
         "tok-exec": Principal(authz.NODE, "n-exec")}
CALLERS = ("none", "user", "other user", "admin", "planner", "profiler", "this node", "another node")
# U: UNAUTHENTICATED, D: PERMISSION_DENIED, A: allowed (any other outcome: the call reached the servicer).
# Requests that name a node name "n1" ("this node"). CancelJob and GetJobLogs name no stored job here
# (owners: test_users_cancel_and_read_only_their_own_jobs).
#                                            none user other admin planner profiler this another
EXPECTED = {
    "RegistryService/RegisterNode":            "U    D    D     D     A       D        A    D",
    "RegistryService/KeepAliveNode":           "U    D    D     D     A       D        A    D",
    "RegistryService/DeregisterNode":          "U    D    D     A     A       D        A    D",
    "RegistryService/WatchAllocations":        "U    D    D     D     A       D        A    D",
    "RegistryService/GetNode":                 "U    A    A     A     A       A        A    A",
    "RegistryService/ListNodes":               "U    A    A     A     A       A        A    A",
    "RegistryService/ListClaims":              "U    A    A     A     A       A        A    A",
    "RegistryService/WatchCluster":            "U    A    A     A     A       A        A    A",
    "ExecutorService/GetJobs":                 "U    D    D     A     A       D        D    D",
    "ExecutorService/WatchEvents":             "U    D    D     A     A       D        D    D",
    "ExecutorService/GetLogs":                 "U    D    D     A     A       D        D    D",
    "PlannerService/SubmitJobs":               "U    A    A     A     D       D        D    D",
    "PlannerService/CancelJob":                "U    A    A     A     D       D        D    D",
    "PlannerService/GetPlan":                  "U    A    A     A     D       D        D    D",
    "PlannerService/WatchJobs":                "U    A    A     A     D       D        D    D",
    "PlannerService/ListJobs":                 "U    A    A     A     D       D        D    D",
    "PlannerService/GetReport":                "U    A    A     A     D       D        D    D",
    "PlannerService/GetJobLogs":               "U    A    A     A     D       D        D    D",
    "PlannerService/RunTrial":                 "U    D    D     D     D       A        D    D",
    "ProfilerService/Profile":                 "U    A    A     A     A       D        D    D",
    "ProfilerService/GetProfile":              "U    A    A     A     A       D        D    D",
    "ServerReflection/ServerReflectionInfo":   "U    A    A     A     A       A        A    A",
    "Health/Check":                            "A    A    A     A     A       A        A    A",
}
CODES = {"U": grpc.StatusCode.UNAUTHENTICATED, "D": grpc.StatusCode.PERMISSION_DENIED}


def _requests():
    """"Service/Method" -> (stub class, request): each valid enough to pass authorization, harmless after it."""
    r, e, p, f = registry_pb2, executor_pb2, planner_pb2, profiler_pb2
    return {
        "RegistryService/RegisterNode": r.RegisterNodeRequest(node_id="n1", address="127.0.0.1:1", ttl_seconds=0),
        "RegistryService/KeepAliveNode": r.KeepAliveNodeRequest(node_id="n1"),
        "RegistryService/DeregisterNode": r.DeregisterNodeRequest(node_id="n1"),
        "RegistryService/WatchAllocations": r.WatchAllocationsRequest(node_id="n1"),
        "RegistryService/GetNode": r.GetNodeRequest(node_id="n1"),
        "RegistryService/ListNodes": r.ListNodesRequest(),
        "RegistryService/ListClaims": r.ListClaimsRequest(),
        "RegistryService/WatchCluster": r.WatchClusterRequest(),
        "ExecutorService/GetJobs": e.GetJobsRequest(),
        "ExecutorService/WatchEvents": e.WatchEventsRequest(after_seq=-1),
        "ExecutorService/GetLogs": e.GetLogsRequest(job_id="nope"),
        "PlannerService/SubmitJobs": p.SubmitJobsRequest(),
        "PlannerService/CancelJob": p.CancelJobRequest(job_id="nope"),
        "PlannerService/GetPlan": p.GetPlanRequest(),
        "PlannerService/WatchJobs": p.WatchJobsRequest(job_ids=["nope"]),
        "PlannerService/ListJobs": p.ListJobsRequest(),
        "PlannerService/GetReport": p.GetReportRequest(),
        "PlannerService/GetJobLogs": p.GetJobLogsRequest(job_id="nope"),
        "PlannerService/RunTrial": p.RunTrialRequest(),
        "ProfilerService/Profile": f.ProfileRequest(),
        "ProfilerService/GetProfile": f.GetProfileRequest(),
        "ServerReflection/ServerReflectionInfo": reflection_pb2.ServerReflectionRequest(list_services=""),
        "Health/Check": health_pb2.HealthCheckRequest(),
    }


STUBS = {"RegistryService": registry_pb2_grpc.RegistryServiceStub, "ExecutorService": executor_pb2_grpc.ExecutorServiceStub,
         "PlannerService": planner_pb2_grpc.PlannerServiceStub, "ProfilerService": profiler_pb2_grpc.ProfilerServiceStub,
         "ServerReflection": reflection_pb2_grpc.ServerReflectionStub, "Health": health_pb2_grpc.HealthStub}


async def outcome(channel, rpc: str, request) -> grpc.StatusCode:
    """The status of one call (a stream: of its first message; DEADLINE_EXCEEDED when none came in 1 s)."""
    service, method = rpc.split("/")
    call = getattr(STUBS[service](channel), method)
    try:
        if rpc == "ServerReflection/ServerReflectionInfo":
            stream = call(iter([request]), timeout=5)
            await stream.read()
        elif isinstance(call, grpc.aio.UnaryStreamMultiCallable):
            stream = call(request, timeout=1.0)
            await stream.read()
            stream.cancel()
        else:
            await call(request, timeout=15)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def node_certs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("certs") / "ours"
    subprocess.run(["bash", str(ROOT / "deploy" / "make-certs.sh"), str(out), "127.0.0.1"], check=True,
                   capture_output=True, env={"OMRU_NODES": "n1 n2 n-exec", "PATH": "/usr/bin:/bin"})
    return out


def _tls(certs: Path, name: str) -> cfg.TlsConfig:
    return cfg.TlsConfig(certs / f"{name}.pem", certs / f"{name}-key.pem", certs / "ca.pem")


def server_config(**kw) -> cfg.ServerConfig:
    return cfg.ServerConfig(port=0, tokens=TABLE, **kw)


#: Under mutual TLS: caller kind -> (its certificate, its token); services and nodes are their certificates.
MTLS_CALLERS = {"none": ("client", None), "user": ("client", "tok-alice"), "other user": ("client", "tok-bob"),
                "admin": ("client", "tok-root"), "planner": ("planner", None), "profiler": ("profiler", None),
                "this node": ("executor-n1", None), "another node": ("executor-n2", None)}


@pytest.fixture(params=["tokens", "mutual TLS"])
async def servers(request, etcd, tmp_path, node_certs):
    """Registry, profiler, planner and one executor (node n-exec): with "tokens", each with the tokens table and
    its own token; with "mutual TLS", each with its own certificate and the users' tokens. (mode, servers)"""
    from services.executor import server as executor
    from services.planner import server as planner
    from services.profiler import server as profiler
    from services.registry import server as registry

    def server(name: str, cert: str) -> cfg.ServerConfig:
        if request.param == "tokens":
            return server_config(service_token=f"tok-{name}")
        users = {t: p for t, p in TABLE.items() if p.kind in authz.USERS}
        return cfg.ServerConfig(port=0, tokens=users, tls=_tls(node_certs, cert))

    etcd_config = cfg.EtcdConfig(endpoint=etcd.endpoint)
    started = []
    try:
        started.append(await registry.start(cfg.RegistryConfig(server=server("registry", "registry"), etcd=etcd_config)))
        reg = started[0].address
        started.append(await profiler.start(cfg.ProfilerConfig(server=server("profiler", "profiler"), etcd=etcd_config,
                                                               registry=reg)))
        started.append(await planner.start(cfg.PlannerConfig(
            server=server("planner", "planner"), etcd=etcd_config, registry=reg, profiler=started[1].address,
            checkpoint_root=str(tmp_path / "ckpt"))))
        running, _ = await executor.start(cfg.ExecutorConfig(
            node_id="n-exec", server=server("exec", "executor-n-exec"), registry=reg, slots=1, ttl_seconds=10,
            work_dir=tmp_path / "node", warm_workers=False, checkpoint_root=tmp_path / "ckpt"))
        started.append(running)
        yield request.param, dict(zip(("RegistryService", "ProfilerService", "PlannerService", "ExecutorService"),
                                      started))
    finally:
        for s in reversed(started):
            await s.stop(0)


async def test_every_rpc_of_every_service_has_a_row_in_the_table_and_in_this_test():
    from omru.v1 import executor_pb2 as e, planner_pb2 as p, profiler_pb2 as f, registry_pb2 as r

    rpcs = {f"{s.full_name}/{m.name}" for mod in (e, p, f, r) for s in mod.DESCRIPTOR.services_by_name.values()
            for m in s.methods}
    table = {f"{service}/{rpc}" for service, rows in authz.TABLE.items() for rpc in rows if service.startswith("omru.")}
    assert table == rpcs
    assert {f"omru.v1.{rpc}" for rpc in EXPECTED if rpc.startswith(("Registry", "Executor", "Planner", "Profiler"))} == rpcs


async def test_the_table_row_by_row_for_every_caller_kind_against_real_servers(servers, node_certs):
    """With tokens (as under `omru up`) and under mutual TLS (as deployed), the same expected table."""
    mode, servers = servers
    requests = _requests()

    def channel(caller: str, address: str) -> grpc.aio.Channel:
        if mode == "tokens":
            return open_channel(address, token=TOKENS.get(caller))
        cert, token = MTLS_CALLERS[caller]
        return open_channel(address, token=token, tls=_tls(node_certs, cert))

    channels = {caller: {name: channel(caller, s.address) for name, s in servers.items()} for caller in CALLERS}
    try:
        got, wanted = {}, {}
        for rpc, row in EXPECTED.items():
            service = rpc.split("/")[0]
            target = service if service in servers else "RegistryService"  # health, reflection: any server
            for caller, letter in zip(CALLERS, row.split()):
                code = await outcome(channels[caller][target], rpc, requests[rpc])
                got[rpc, caller] = "U" if code == grpc.StatusCode.UNAUTHENTICATED else (
                    "D" if code == grpc.StatusCode.PERMISSION_DENIED else "A")
                wanted[rpc, caller] = letter
        assert {k: v for k, v in got.items() if v != wanted[k]} == {}
    finally:
        for by_service in channels.values():
            for channel in by_service.values():
                await channel.close()


@pytest.mark.parametrize("servers", ["tokens"], indirect=True)
async def test_a_refusal_names_the_method_and_the_principal(servers):
    _, servers = servers
    async with open_channel(servers["RegistryService"].address, token="tok-n2") as channel:
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await stub.RegisterNode(register_request("n1"), timeout=5)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "RegisterNode" in denied.value.details() and "node 'n2'" in denied.value.details()
        assert "'n1'" in denied.value.details()
        assert (await stub.ListNodes(registry_pb2.ListNodesRequest(), timeout=5)).nodes  # n-exec, not n1
        assert "n1" not in [n.node_id for n in (await stub.ListNodes(registry_pb2.ListNodesRequest(), timeout=5)).nodes]
    async with open_channel(servers["PlannerService"].address, token="tok-alice") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await planner_pb2_grpc.PlannerServiceStub(channel).RunTrial(planner_pb2.RunTrialRequest(), timeout=5)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "RunTrial" in denied.value.details() and "user 'alice'" in denied.value.details()
    async with open_channel(servers["PlannerService"].address, token="not-a-token") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await planner_pb2_grpc.PlannerServiceStub(channel).ListJobs(planner_pb2.ListJobsRequest(), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.UNAUTHENTICATED and "wrong" in unknown.value.details()


def _job(job_id: str):
    return common_pb2.JobSpec(job_id=job_id, model="resnet18", dataset="digits", epochs=2, batch_size=16, base_lr=0.05,
                              base_batch=16, image_size=8, train_samples=64)


async def test_users_cancel_and_read_only_their_own_jobs_an_admin_any(etcd, tmp_path):
    """Two users with their own tokens (no node: the job waits): bob cannot cancel or read alice's job,
    root (an admin) can; the job records its owner and ListJobs shows it."""
    from services.planner import server as planner
    from services.registry import server as registry

    etcd_config = cfg.EtcdConfig(endpoint=etcd.endpoint)
    reg = await registry.start(cfg.RegistryConfig(server=server_config(service_token="tok-registry"), etcd=etcd_config))
    plan = await planner.start(cfg.PlannerConfig(server=server_config(service_token="tok-planner"), etcd=etcd_config,
                                                 registry=reg.address, profiler="127.0.0.1:1",
                                                 checkpoint_root=str(tmp_path / "ckpt")))
    stubs, channels = {}, []
    try:
        for who in ("alice", "bob", "root"):
            channels.append(open_channel(plan.address, token=f"tok-{who}"))
            stubs[who] = planner_pb2_grpc.PlannerServiceStub(channels[-1])
        profile = planner_pb2.JobProfile(job_id="a-job", epoch_seconds={1: 10.0})
        await stubs["alice"].SubmitJobs(planner_pb2.SubmitJobsRequest(jobs=[_job("a-job")], profiles=[profile]), timeout=15)
        listed = (await stubs["bob"].ListJobs(planner_pb2.ListJobsRequest(), timeout=5)).jobs
        assert [(j.job_id, j.owner) for j in listed] == [("a-job", "alice")]
        from omru.cli.commands.status import Held, row
        from omru.client import Client, PlanInfo

        async with Client(plan.address, token="tok-bob") as sdk:  # the SDK and omru status name her too
            (job,) = await sdk.status()
        assert job.owner == "alice"
        assert row(job, PlanInfo(0, "", 0.0, 0.0, ()), Held({}, {}), 0.0).cells()[:2] == ["a-job", "alice"]
        for call in (stubs["bob"].CancelJob(planner_pb2.CancelJobRequest(job_id="a-job"), timeout=15),
                     stubs["bob"].GetJobLogs(planner_pb2.GetJobLogsRequest(job_id="a-job"), timeout=5).read()):
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await call
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "user 'bob'" in denied.value.details() and "'alice'" in denied.value.details()
        state = (await stubs["bob"].ListJobs(planner_pb2.ListJobsRequest(), timeout=5)).jobs[0].state
        assert common_pb2.JobState.Name(state) != "JOB_STATE_CANCELLED"
        with pytest.raises(grpc.aio.AioRpcError) as no_logs:  # alice reaches her job's logs (none yet)
            await stubs["alice"].GetJobLogs(planner_pb2.GetJobLogsRequest(job_id="a-job"), timeout=5).read()
        assert no_logs.value.code() == grpc.StatusCode.NOT_FOUND
        done = await stubs["root"].CancelJob(planner_pb2.CancelJobRequest(job_id="a-job"), timeout=15)
        assert common_pb2.JobState.Name(done.state) == "JOB_STATE_CANCELLED"
    finally:
        for channel in channels:
            await channel.close()
        await plan.stop(0)
        await reg.stop(0)


async def test_a_job_stored_without_an_owner_still_reads_and_only_an_admin_cancels_it(etcd_store):
    import json

    from services.planner import state as st

    record = st.JobRecord(spec={"job_id": "old", "epochs": 2}, state=st.WAITING)
    old = {k: v for k, v in json.loads(record.to_json()).items() if k != "owner"}  # as older code stored it
    read = st.JobRecord.from_json(json.dumps(old).encode())
    assert read.owner == "" and read.job_id == "old"
    assert not authz.may_act_on(Principal(authz.USER, "alice"), read.owner)
    assert authz.may_act_on(Principal(authz.ADMIN, "root"), read.owner)
    assert authz.may_act_on(authz.OPEN, read.owner)  # no auth: as before


async def test_under_mutual_tls_a_node_certificate_acts_only_as_its_node(etcd, node_certs):
    """The certificate's common name is the principal: omru-executor-n1 registers and watches n1 only, and
    cannot act as the planner, another node, or a user; omru-planner can."""
    from services.registry import server as registry

    reg = await registry.start(cfg.RegistryConfig(
        server=cfg.ServerConfig(port=0, tls=_tls(node_certs, "registry"), auth_token="tok-root"),
        etcd=cfg.EtcdConfig(endpoint=etcd.endpoint)))
    channels = {who: open_channel(reg.address, tls=_tls(node_certs, who), server_name="omru-registry")
                for who in ("executor-n1", "executor-n2", "planner")}
    try:
        n1 = registry_pb2_grpc.RegistryServiceStub(channels["executor-n1"])
        await n1.RegisterNode(register_request("n1"), timeout=5)
        for call in (n1.RegisterNode(register_request("n2"), timeout=5),
                     n1.DeregisterNode(registry_pb2.DeregisterNodeRequest(node_id="n2"), timeout=5),
                     n1.WatchAllocations(registry_pb2.WatchAllocationsRequest(node_id="n2"), timeout=5).read()):
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await call
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED and "node 'n1'" in denied.value.details()
        first = await n1.WatchAllocations(registry_pb2.WatchAllocationsRequest(node_id="n1"), timeout=5).read()
        assert first.snapshot
        n2 = registry_pb2_grpc.RegistryServiceStub(channels["executor-n2"])
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await n2.DeregisterNode(registry_pb2.DeregisterNodeRequest(node_id="n1"), timeout=5)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert [n.node_id for n in (await n2.ListNodes(registry_pb2.ListNodesRequest(), timeout=5)).nodes] == ["n1"]
        planner = registry_pb2_grpc.RegistryServiceStub(channels["planner"])
        assert (await planner.DeregisterNode(registry_pb2.DeregisterNodeRequest(node_id="n1"), timeout=5)).removed
    finally:
        for channel in channels.values():
            await channel.close()
        await reg.stop(0)
    # a node's certificate is no user: the planner refuses it (its services take users' tokens)
    from services.planner import server as planner_server

    plan = await planner_server.start(cfg.PlannerConfig(
        server=cfg.ServerConfig(port=0, tls=_tls(node_certs, "planner"), auth_token="tok-root"),
        etcd=cfg.EtcdConfig(endpoint=etcd.endpoint), registry="127.0.0.1:1", profiler="127.0.0.1:1"))
    try:
        async with open_channel(plan.address, tls=_tls(node_certs, "executor-n1"), server_name="omru-planner") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await planner_pb2_grpc.PlannerServiceStub(ch).RunTrial(planner_pb2.RunTrialRequest(), timeout=5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED and "node 'n1'" in denied.value.details()
        async with open_channel(plan.address, token="tok-root", tls=_tls(node_certs, "client"),
                                server_name="omru-planner") as ch:
            assert not (await planner_pb2_grpc.PlannerServiceStub(ch).ListJobs(planner_pb2.ListJobsRequest(),
                                                                               timeout=5)).jobs
    finally:
        await plan.stop(0)


def test_only_a_node_certificate_names_a_node_and_under_mutual_tls_others_need_a_token():
    """make-certs issues no shared executor certificate any more, and its old name is no node; under mutual TLS a
    certificate that names no service or node (a user's) gets in only with a token, even with no token known."""
    def who(cn: str, mutual_tls: bool, token: str = ""):
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        return authz.Authenticator({}, None, mutual_tls=mutual_tls).principal(metadata, {"x509_common_name": [cn.encode()]})

    assert who("omru-executor-n1", True) == Principal(authz.NODE, "n1")
    assert who("omru-planner", True) == Principal(authz.PLANNER, authz.PLANNER)
    assert who("omru-executor", True) == who("omru-client", True) == "missing"
    assert who("omru-client", True, token="tok-anything") == "wrong"
    assert who("omru-client", False) == authz.OPEN  # no token, no mutual TLS: a single-user machine, open
    assert not authz.permits(authz.allowed("/omru.v1.RegistryService/RegisterNode"), Principal(authz.NODE, "n1"), "n2")


@pytest.mark.parametrize("text, named", [
    ("tok alice\n", "line 1: expected 'token name role', got 2 fields"),
    ("tok-a alice user\ntok-b bob root\n", "line 2: role 'root' is not one of"),
    ("tok-a alice user\ntok-a bob user\n", "line 2: this token is given twice"),
    ("tok-a al/ice user\n", "line 1: name 'al/ice' is not a valid id"),
    ("tok-a alice user\ntok-b alice admin\n", "line 2: user 'alice' has role 'user' on an earlier line"),
    ("tok-p pl planner\n", "line 1: a planner token's name must be 'planner'"),
    ("# nobody\n\n", "names no token"),
])
def test_a_bad_tokens_file_is_an_error_naming_the_bad_value(tmp_path, text, named):
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(cfg.ConfigError) as error:
        authz.read_tokens(path)
    assert named in str(error.value)
    assert "tok-" not in str(error.value)  # a token is never echoed


def test_services_exit_2_naming_a_bad_tokens_file_and_omru_up_too(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("tok-a alice superuser\n")
    for argv in (["-m", "services.registry.server", "--auth-tokens", str(path)],
                 ["-m", "omru.cli.main", "up", "--auth-tokens", str(path)]):
        done = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), *argv], capture_output=True, text=True,
                              cwd=ROOT, timeout=60)
        assert done.returncode == 2, (argv, done.stderr)
        assert "role 'superuser'" in done.stderr, done.stderr
    path.write_text("tok-a alice user\n")
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "omru.cli.main", "up", "--auth-tokens",
                           str(path)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={"OMRU_AUTH_TOKEN": "tok-a", "PATH": "/usr/bin:/bin",
                               "OMRU_CONTEXT": str(tmp_path / "ctx.json")})
    assert done.returncode == 2 and "must be an admin's token" in done.stderr, done.stderr


async def test_open_without_tokens_and_without_mutual_tls(registry, registry_stub):
    """No token configured, no mutual TLS: every caller may call everything, as before."""
    await registry_stub.RegisterNode(register_request("n-open"), timeout=5)
    assert (await registry_stub.DeregisterNode(registry_pb2.DeregisterNodeRequest(node_id="n-open"), timeout=5)).removed


async def test_omru_up_gives_each_service_and_node_its_own_token_and_users_theirs(free_port, tmp_path):
    """`omru up` with $OMRU_AUTH_TOKEN (an admin's) and --auth-tokens (users): the services reach each other
    with their own tokens (both nodes register, the planner counts their GPUs), the admin's token is no
    service's, users are users; SIGTERM leaves nothing behind."""
    import json
    import os
    import signal
    import sys
    import time

    from platform_helpers import alive, descendants

    users = tmp_path / "users"
    users.write_text("tok-alice alice user\ntok-prom prometheus metrics\n")
    work = tmp_path / "work"
    env = dict(os.environ, OMP_NUM_THREADS="1", OMRU_AUTH_TOKEN="tok-root")
    proc = subprocess.Popen([sys.executable, "-m", "omru", "up", "--nodes", "2", "--slots-per-node", "1", "--port",
                             str(free_port()), "--no-warm-workers", "--auth-tokens", str(users),
                             "--work-dir", str(work)],
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "up.log", "wb"), text=True, env=env)
    try:
        ready = json.loads(await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120))
        children = set(descendants(proc.pid))
        assert (work / "auth-tokens").stat().st_mode & 0o077 == 0
        channels = {who: open_channel(ready["planner"], token=token) for who, token in
                    (("none", None), ("alice", "tok-alice"), ("root", "tok-root"))}
        registries = {who: open_channel(ready["registry"], token=token) for who, token in
                      (("alice", "tok-alice"), ("root", "tok-root"))}
        try:
            root = planner_pb2_grpc.PlannerServiceStub(channels["root"])
            for _ in range(150):  # the planner watches the registry, the nodes registered: each with its own token
                if (await root.GetReport(planner_pb2.GetReportRequest(), timeout=5)).report.gpus == 2:
                    break
                await asyncio.sleep(0.2)
            assert (await root.GetReport(planner_pb2.GetReportRequest(), timeout=5)).report.gpus == 2
            # etcd serves the services alone: neither anyone nor a user's token gets in (the probe)
            status, body = etcd_http_range(ready["etcd"])
            assert status == 400 and "user name is empty" in body, (status, body)
            assert (work / "etcd-root-password").stat().st_mode & 0o077 == 0
            # metrics: an admin's and the scraper's token read them, a user's does not
            import urllib.error
            import urllib.request

            def scrape(token: str) -> int:
                request = urllib.request.Request(f"http://{ready['metrics']['planner']}/metrics",
                                                 headers={"Authorization": f"Bearer {token}"})
                try:
                    with urllib.request.urlopen(request, timeout=10) as reply:
                        return reply.status
                except urllib.error.HTTPError as exc:
                    return exc.code

            assert {t: await asyncio.to_thread(scrape, t) for t in ("tok-root", "tok-prom", "tok-alice", "nope")} == {
                "tok-root": 200, "tok-prom": 200, "tok-alice": 403, "nope": 401}
            for user, password in ((None, None), ("registry", "tok-root"), ("alice", "tok-alice"), ("root", "tok-root")):
                async with EtcdStore(ready["etcd"], timeout=2.0, user=user, password=password) as store:
                    with pytest.raises(EtcdUnavailable):
                        await store.list()
            codes = {
                "none ListJobs": await outcome(channels["none"], "PlannerService/ListJobs", planner_pb2.ListJobsRequest()),
                "alice SubmitJobs": await outcome(channels["alice"], "PlannerService/SubmitJobs",
                                                  planner_pb2.SubmitJobsRequest()),
                "alice RunTrial": await outcome(channels["alice"], "PlannerService/RunTrial", planner_pb2.RunTrialRequest()),
                "root RegisterNode": await outcome(registries["root"], "RegistryService/RegisterNode",
                                                   register_request("node-0")),
                "alice WatchAllocations": await outcome(registries["alice"], "RegistryService/WatchAllocations",
                                                        registry_pb2.WatchAllocationsRequest(node_id="node-0")),
                "root DeregisterNode": await outcome(registries["root"], "RegistryService/DeregisterNode",
                                                     registry_pb2.DeregisterNodeRequest(node_id="node-9")),
            }
            assert codes == {"none ListJobs": grpc.StatusCode.UNAUTHENTICATED,
                             "alice SubmitJobs": grpc.StatusCode.INVALID_ARGUMENT,  # (reached the planner: no jobs)
                             "alice RunTrial": grpc.StatusCode.PERMISSION_DENIED,
                             "root RegisterNode": grpc.StatusCode.PERMISSION_DENIED,
                             "alice WatchAllocations": grpc.StatusCode.PERMISSION_DENIED,
                             "root DeregisterNode": grpc.StatusCode.OK}
        finally:
            for channel in (*channels.values(), *registries.values()):
                await channel.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(pid) for pid in children):
            await asyncio.sleep(0.1)
        assert not [pid for pid in children if alive(pid)], "processes left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_local_cluster_without_auth_stays_open_whatever_token_the_environment_holds(tmp_path, monkeypatch):
    """`omru demo` and `omru emulate` start a LocalCluster without auth: a token exported in the shell must
    not make its services require one from clients and nodes that send none."""
    from services.common.cluster import LocalCluster

    monkeypatch.setenv("OMRU_AUTH_TOKEN", "tok-stray")
    cluster = LocalCluster(nodes=0, planner_port=0, work_dir=tmp_path / "up", metrics=False)
    await asyncio.to_thread(cluster.start)
    try:
        async with open_channel(cluster.service("registry").address) as channel:
            stub = registry_pb2_grpc.RegistryServiceStub(channel)
            await stub.RegisterNode(register_request("n-any"), timeout=5)
            assert [n.node_id for n in (await stub.ListNodes(registry_pb2.ListNodesRequest(), timeout=5)).nodes] == ["n-any"]
        assert etcd_http_range(cluster.etcd_endpoint)[0] == 200  # etcd is locked only with auth
    finally:
        await asyncio.to_thread(cluster.stop)
