"""Security with certificates from deploy/make-certs.sh: mutual TLS between
services, executors following only the registry's identity, etcd over TLS,
and no pickle on any wire. (Bearer tokens and a TLS server refusing a
plaintext client: test_auth_tls.py.)"""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import grpc
import pytest
from conftest import start_registry

from omru.v1 import registry_pb2, registry_pb2_grpc
from platform_helpers import etcd_http_range, register_request, rpc_error
from services.common import config as cfg
from services.common.channels import open_channel
from services.common.cluster import free_port
from services.common.etcd import EtcdStore, EtcdUnavailable

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "mtls-token"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """Our CAs and certificates (services, the nodes of NODES, client, etcd) for 127.0.0.1, and another set."""
    out = tmp_path_factory.mktemp("certs")
    env = {"OMRU_NODES": " ".join(NODES), "PATH": "/usr/bin:/bin"}
    for name in ("ours", "other"):
        subprocess.run(["bash", str(ROOT / "deploy" / "make-certs.sh"), str(out / name), "127.0.0.1"], check=True,
                       capture_output=True, env=env)
    return out


#: The node ids of this file's tests: make-certs writes executor-<node>.pem for each.
NODES = ("n-good", "n-imp", "n-gen", "n-proc")


def tls(certs: Path, service: str, ca: str = "ours", trust: str = "ca") -> cfg.TlsConfig:
    """The certificate of omru-<service> (from the `ca` set) trusting our `trust` CA (etcd's: "etcd-ca")."""
    return cfg.TlsConfig(certs / ca / f"{service}.pem", certs / ca / f"{service}-key.pem", certs / "ours" / f"{trust}.pem")


def mtls_server(certs: Path, service: str) -> cfg.ServerConfig:
    return cfg.ServerConfig(tls=tls(certs, service), auth_token=TOKEN)


async def test_with_mutual_tls_only_clients_with_a_certificate_of_the_ca_and_the_token_get_in(etcd, certs):
    server = await start_registry(etcd.endpoint, tls=tls(certs, "registry"), auth_token=TOKEN)
    ca_only = cfg.TlsConfig(ca_file=certs / "ours" / "ca.pem")
    refused = {
        "no certificate": open_channel(server.address, token=TOKEN, tls=ca_only),
        "another CA's certificate": open_channel(server.address, token=TOKEN, tls=tls(certs, "client", ca="other")),
        "plaintext": open_channel(server.address, token=TOKEN),
    }
    for what, channel in refused.items():
        error = await rpc_error(registry_pb2_grpc.RegistryServiceStub(channel).RegisterNode(register_request("n-bad"), timeout=3))
        assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), what
    no_token = open_channel(server.address, tls=tls(certs, "client"))
    error = await rpc_error(registry_pb2_grpc.RegistryServiceStub(no_token).ListNodes(registry_pb2.ListNodesRequest()))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED  # a certificate does not replace the token
    good = open_channel(server.address, token=TOKEN, tls=tls(certs, "client"))  # an admin user
    stub = registry_pb2_grpc.RegistryServiceStub(good)
    node = open_channel(server.address, tls=tls(certs, "executor-n-good"))  # a node's certificate names it (no token)
    await registry_pb2_grpc.RegistryServiceStub(node).RegisterNode(register_request("n-good"))
    assert [n.node_id for n in (await stub.ListNodes(registry_pb2.ListNodesRequest())).nodes] == ["n-good"]
    for channel in (*refused.values(), no_token, good, node):
        await channel.close()
    await server.stop(0)


@pytest.fixture
async def mtls_registry(etcd, certs):
    server = await start_registry(etcd.endpoint, tls=tls(certs, "registry"), auth_token=TOKEN)
    yield server
    await server.stop(0)


async def start_executor(certs: Path, registry: str, node_id: str, work_dir: Path):
    from services.executor import server

    config = cfg.ExecutorConfig(node_id=node_id, server=mtls_server(certs, f"executor-{node_id}"), registry=registry,
                                slots=2, ttl_seconds=10, work_dir=work_dir)
    running, _membership = await server.start(config)
    return running


async def test_executor_follows_only_a_registry_whose_certificate_names_the_registry(etcd, certs, tmp_path):
    """The registry streams the allocations a node runs: one with another service's certificate (same CA,
    valid for 127.0.0.1) is refused at the handshake, and nothing registers through it."""
    impostor = await start_registry(etcd.endpoint, tls=tls(certs, "planner"), auth_token=TOKEN)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await start_executor(certs, impostor.address, "n-imp", tmp_path / "imp")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        async with open_channel(impostor.address, token=TOKEN, tls=tls(certs, "client")) as channel:
            nodes = (await registry_pb2_grpc.RegistryServiceStub(channel).ListNodes(registry_pb2.ListNodesRequest())).nodes
        assert list(nodes) == []
    finally:
        await impostor.stop(0)
    genuine = await start_registry(etcd.endpoint, tls=tls(certs, "registry"), auth_token=TOKEN)
    executor = await start_executor(certs, genuine.address, "n-gen", tmp_path / "gen")
    try:
        async with open_channel(genuine.address, token=TOKEN, tls=tls(certs, "client")) as channel:
            nodes = (await registry_pb2_grpc.RegistryServiceStub(channel).ListNodes(registry_pb2.ListNodesRequest())).nodes
        assert [n.node_id for n in nodes] == ["n-gen"]
    finally:
        await executor.stop(0)
        await genuine.stop(0)


@pytest.fixture
def tls_etcd(certs, tmp_path):
    """A real etcd serving clients over https only, requiring client certificates of our etcd CA."""
    port, peer = free_port(), free_port()
    ours = certs / "ours"
    url = f"https://127.0.0.1:{port}"
    log = open(tmp_path / "etcd-tls.log", "wb")
    proc = subprocess.Popen(
        ["etcd", "--name", "tls", "--data-dir", str(tmp_path / "etcd-tls"), "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}", "--initial-cluster", f"tls=http://127.0.0.1:{peer}",
         "--cert-file", str(ours / "etcd.pem"), "--key-file", str(ours / "etcd-key.pem"),
         "--trusted-ca-file", str(ours / "etcd-ca.pem"), "--client-cert-auth", "--log-level", "warn", "--logger", "zap"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)
    log.close()


async def _until_up(store: EtcdStore, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await store.put("probe", b"1")
            return
        except EtcdUnavailable:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_etcd_over_tls_serves_the_store_and_the_registry_and_refuses_plaintext(tls_etcd, certs):
    etcd_tls = tls(certs, "etcd-registry", trust="etcd-ca")
    async with EtcdStore(tls_etcd, tls=etcd_tls) as store:
        await _until_up(store)
        await store.put("a", b"x")
        assert (await store.get("a")).value == b"x"
        assert (await store.create({"b": b"y"})).succeeded
        lease = await store.grant_lease(5)
        assert await store.refresh_lease(lease) > 0
    # plaintext; TLS without a certificate; the users' and a node's certificates (of the other CA), a service's own
    refused = (None, cfg.TlsConfig(ca_file=certs / "ours" / "etcd-ca.pem"), tls(certs, "client", trust="etcd-ca"),
               tls(certs, "executor-n-good", trust="etcd-ca"), tls(certs, "registry", trust="etcd-ca"))
    for client_tls in refused:
        async with EtcdStore(tls_etcd, timeout=1.0, tls=client_tls) as store:
            with pytest.raises(EtcdUnavailable):
                await store.get("a")

    from services.registry.server import start

    registry = await start(cfg.RegistryConfig(etcd=cfg.EtcdConfig(endpoint=tls_etcd, tls=etcd_tls)))
    try:
        async with open_channel(registry.address) as channel:
            stub = registry_pb2_grpc.RegistryServiceStub(channel)
            await stub.RegisterNode(register_request("n-etcd-tls"))
            assert [n.node_id for n in (await stub.ListNodes(registry_pb2.ListNodesRequest())).nodes] == ["n-etcd-tls"]
    finally:
        await registry.stop(0)


def test_tls_options_name_the_bad_file_and_exit_2(tmp_path):
    missing = str(tmp_path / "nope.pem")
    cases = [
        (["services.registry.server", "--etcd-ca", missing], f"--etcd-ca {missing!r}"),
        (["services.registry.server", "--tls-cert", missing, "--tls-key", missing], f"--tls-cert {missing!r}"),
        (["services.registry.server", "--tls-ca", str(ROOT / "README.md")], "--tls-cert, --tls-key"),
        (["services.executor.server", "--registry", "127.0.0.1:1", "--registry-identity", "not an id"], "'not an id'"),
        (["omru.cli.main", "status", "--tls-ca", missing], f"--tls-ca {missing!r}"),
        (["services.registry.server", "--etcd-user", "registry"], "etcd user and password must be given together"),
        (["services.registry.server", "--etcd-password-file", missing], f"etcd password file {missing!r} cannot be read"),
        (["services.profiler.server", "--registry", "127.0.0.1:1", "--etcd-user", "a b", "--etcd-password-file",
          str(ROOT / "README.md")], "etcd user 'a b'"),
    ]
    for argv, named in cases:
        done = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", *argv], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert done.returncode == 2, argv
        assert named in done.stderr, (argv, done.stderr)


def test_nothing_unpickles_data_from_the_network_or_from_checkpoints():
    """No pickle-based codec anywhere in the product; every torch.load is weights_only=True."""
    banned = re.compile(r"^\s*(import|from)\s+(pickle|cPickle|dill|cloudpickle|marshal|shelve)\b|"
                        r"\b(broadcast|all_gather|gather|scatter)_object(_list)?\(|\bpickle\.loads?\(", re.M)
    offenders, loads = [], []
    for path in [*(ROOT / "services").rglob("*.py"), *(ROOT / "omru").rglob("*.py")]:
        if "/v1/" in str(path):  # generated stubs
            continue
        text = path.read_text()
        offenders += [f"{path.relative_to(ROOT)}: {m.group(0).strip()}" for m in banned.finditer(text)]
        loads += [(path, m.group(0)) for m in re.finditer(r"torch\.load\([^)]*\)", text)]
    assert offenders == []
    assert loads and all("weights_only=True" in call for _, call in loads)


async def test_service_processes_with_the_deploy_flags_run_mutual_tls_end_to_end(tls_etcd, certs, start_service, tmp_path):
    """The compose files' flags, on real processes: etcd over TLS, mutual TLS between every service, the CLI
    with the client certificate (and refused without it)."""
    ours = certs / "ours"
    async with EtcdStore(tls_etcd, tls=tls(certs, "etcd-registry", trust="etcd-ca")) as store:
        await _until_up(store)

    def flags(service: str) -> list[str]:
        own = "executor-n-proc" if service == "executor" else service
        cert, key = str(ours / f"{own}.pem"), str(ours / f"{own}-key.pem")
        return ["--port", "0", "--tls-cert", cert, "--tls-key", key, "--tls-ca", str(ours / "ca.pem"),
                *(["--auth-token-file", str(ours / "token"), "--etcd", tls_etcd, "--etcd-ca", str(ours / "etcd-ca.pem"),
                   "--etcd-cert", str(ours / f"etcd-{service}.pem"), "--etcd-key", str(ours / f"etcd-{service}-key.pem")]
                  if service != "executor" else [])]  # a node holds its certificate and the CA alone

    registry = await start_service("registry", *flags("registry"))
    profiler = await start_service("profiler", *flags("profiler"), "--registry", registry.address)
    planner = await start_service("planner", *flags("planner"), "--registry", registry.address, "--profiler", profiler.address)
    executor = await start_service("executor", *flags("executor"), "--node-id", "n-proc", "--registry", registry.address,
                                   "--slots", "2", "--work-dir", str(tmp_path / "work"))
    from omru.client import Client
    from omru.v1 import executor_pb2, executor_pb2_grpc

    admin = (ours / "token").read_text().strip()
    codes = {}
    for who, cert, token in (("planner", "planner", None), ("user with the admin's token", "client", admin),
                             ("another node", "executor-n-good", None)):
        async with open_channel(executor.address, token=token, tls=tls(certs, cert)) as channel:
            call = executor_pb2_grpc.ExecutorServiceStub(channel).GetJobs(executor_pb2.GetJobsRequest(), timeout=10)
            codes[who] = (await rpc_error(call)).code() if who != "planner" else (await call, grpc.StatusCode.OK)[1]
    # the node has no token: it answers the planner's certificate, not a user's, whatever token comes with it
    assert codes == {"planner": grpc.StatusCode.OK, "user with the admin's token": grpc.StatusCode.UNAUTHENTICATED,
                     "another node": grpc.StatusCode.PERMISSION_DENIED}, codes

    async with Client(planner.address, token=(ours / "token").read_text().strip(), tls=tls(certs, "client")) as client:
        for _ in range(100):  # the planner learns the node through its mutual-TLS watch of the registry
            if (await client.report()).gpus == 2:
                break
            await asyncio.sleep(0.2)
        assert (await client.report()).gpus == 2

    def omru_status(*extra: str) -> subprocess.CompletedProcess:
        env = {"OMRU_AUTH_TOKEN": (ours / "token").read_text().strip(), "PATH": "/usr/bin:/bin"}
        return subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "omru.cli.main", "status", "--planner",
                               planner.address, "--tls-ca", str(ours / "ca.pem"), *extra],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)

    assert omru_status("--tls-cert", str(ours / "client.pem"), "--tls-key", str(ours / "client-key.pem")).returncode == 0
    refused = omru_status()  # no client certificate: refused in the handshake
    assert refused.returncode != 0 and "UNAVAILABLE" in refused.stderr, refused.stderr


async def test_etcd_locked_serves_only_its_users_on_the_prefix_and_they_sign_in_again_after_a_restart(etcd):
    """enable_auth (what `omru up` with credentials does): no request without a user's token, by aetcd or by
    the JSON gateway; a service user reads and writes the prefix only, and keeps working, its watch included,
    across an etcd restart (etcd forgets every token). A rerun on the same data needs the root password."""
    from services.common.etcd import WatchBatch, enable_auth

    await enable_auth(etcd.endpoint, "/omru/", "root-pw", {"registry": "reg-pw"})
    status, body = etcd_http_range(etcd.endpoint)
    assert status == 400 and "user name is empty" in body and "kvs" not in body
    async with EtcdStore(etcd.endpoint, timeout=2.0) as anonymous:
        with pytest.raises(EtcdUnavailable, match="user name is empty"):
            await anonymous.list()
        with pytest.raises(EtcdUnavailable):
            await anonymous.put("x", b"1")
    async with EtcdStore(etcd.endpoint, timeout=2.0, user="registry", password="wrong") as impostor:
        with pytest.raises(EtcdUnavailable, match="authentication failed"):
            await impostor.get("x")
    async with EtcdStore(etcd.endpoint, "/other/", timeout=2.0, user="registry", password="reg-pw") as outside:
        with pytest.raises(EtcdUnavailable, match="permission denied"):
            await outside.put("x", b"1")
    async with EtcdStore(etcd.endpoint, timeout=2.0, user="registry", password="reg-pw") as store:
        await store.put("a", b"1")
        assert (await store.create({"b": b"2"}, lease=await store.grant_lease(30))).succeeded
        kvs, revision = await store.list()
        assert [(kv.key, kv.value) for kv in kvs] == [("a", b"1"), ("b", b"2")]
        changes = store.watch("", revision)
        first = asyncio.ensure_future(changes.__anext__())
        await store.put("a", b"3")
        batch = await asyncio.wait_for(first, 10)
        assert isinstance(batch, WatchBatch) and [(e.key, e.value) for e in batch.events] == [("a", b"3")]
        await asyncio.to_thread(etcd.restart)  # every token gone
        resumed = asyncio.ensure_future(changes.__anext__())
        await asyncio.sleep(1.5)  # the watch reconnects on its own (its stale token refused, it signs in again)
        async with EtcdStore(etcd.endpoint, timeout=2.0, user="registry", password="reg-pw") as other:
            await other.put("c", b"4")
        batch = await asyncio.wait_for(resumed, 20)
        assert [(e.key, e.value) for e in batch.events] == [("c", b"4")]
        await changes.aclose()
        await store.put("d", b"5")  # and requests sign in again too
        assert (await store.get("d")).value == b"5"
    status, _ = etcd_http_range(etcd.endpoint)
    assert status == 400  # still locked after the restart
    with pytest.raises(EtcdUnavailable, match="sign in as root"):
        await enable_auth(etcd.endpoint, "/omru/", "not-root-pw", {"registry": "x"})
    await enable_auth(etcd.endpoint, "/omru/", "root-pw", {"registry": "new-pw", "planner": "pl-pw"})
    for user, password in (("registry", "new-pw"), ("planner", "pl-pw")):
        async with EtcdStore(etcd.endpoint, timeout=2.0, user=user, password=password) as store:
            assert (await store.get("c")).value == b"4"
    async with EtcdStore(etcd.endpoint, timeout=2.0, user="registry", password="reg-pw") as old:
        with pytest.raises(EtcdUnavailable, match="authentication failed"):
            await old.get("c")


async def test_a_locked_etcd_restarted_by_the_supervisor_stays_locked_and_the_services_sign_in_again(tmp_path):
    """`omru up` with credentials: etcd killed and restarted by the supervisor forgets every token; the registry
    writes and the planner follows the registry again (signing in anew), and etcd still refuses anyone."""
    import signal

    from omru.v1 import planner_pb2, planner_pb2_grpc
    from services.common.cluster import LocalCluster

    users = tmp_path / "users"
    users.write_text("tok-root root admin\n")
    cluster = LocalCluster(nodes=1, slots_per_node=1, planner_port=0, work_dir=tmp_path / "up", metrics=False,
                           warm_workers=False, auth_tokens=users)
    await asyncio.to_thread(cluster.start)
    try:
        supervisor = cluster.supervisor()
        cluster.etcd.proc.send_signal(signal.SIGKILL)
        events = []
        for _ in range(200):
            events += await asyncio.to_thread(supervisor.step)
            if any(e.get("restarted") == "etcd" for e in events):
                break
            await asyncio.sleep(0.05)
        assert [e["restarted"] for e in events] == ["etcd"], events
        assert etcd_http_range(cluster.etcd_endpoint)[0] == 400
        planner_token = cluster.service_tokens["planner"]  # (the planner may register any node)
        async with open_channel(cluster.service("registry").address, token=planner_token) as registry, \
                open_channel(cluster.service("planner").address, token="tok-root") as planner:
            await registry_pb2_grpc.RegistryServiceStub(registry).RegisterNode(register_request("n-new", slots=1),
                                                                              timeout=10)
            report = planner_pb2_grpc.PlannerServiceStub(planner)
            for _ in range(150):  # the registry wrote it; its etcd watch streams it to the planner
                if (await report.GetReport(planner_pb2.GetReportRequest(), timeout=5)).report.gpus == 2:
                    break
                await asyncio.sleep(0.2)
            assert (await report.GetReport(planner_pb2.GetReportRequest(), timeout=5)).report.gpus == 2
        assert supervisor.step() == []  # nothing else exited
    finally:
        await asyncio.to_thread(cluster.stop)
