"""Prometheus metrics: every service of a real cluster (etcd, registry, profiler, planner, one
executor, as processes started with --metrics-port 0) answers `curl` on its metrics port with its
omru_* families while a tiny job runs, and their values follow the job; a bearer token guards the
metrics as it guards the gRPC calls; a bad --metrics-port exits 2 naming it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from omru.v1 import planner_pb2, planner_pb2_grpc
from services.common.channels import open_channel
from services.common.cluster import LocalCluster, child_env
from tests.executor.service_builders import tiny_job
from tests.platform.platform_helpers import exported_families

#: The families each service exports (the dashboard, deploy/grafana/omru.json, uses only these).
FAMILIES = {
    "registry": {"omru_registry_lease_renewals", "omru_registry_registrations",
                 "omru_registry_nodes", "omru_registry_gpus", "omru_registry_gpus_claimed", "omru_etcd_errors"},
    "profiler": {"omru_profiler_trials", "omru_profiler_trial_seconds", "omru_profiler_profiles",
                 "omru_profiler_profile_seconds", "omru_etcd_errors"},
    "planner": {"omru_planner_reconciles", "omru_planner_plan_seconds", "omru_planner_claim_seconds",
                "omru_planner_leader", "omru_planner_jobs", "omru_planner_queue_length",
                "omru_planner_job_epochs_done", "omru_planner_job_epochs", "omru_planner_job_world_size",
                "omru_planner_job_state", "omru_planner_gpus_owned", "omru_planner_gpus", "omru_planner_nodes",
                "omru_planner_plan_version", "omru_planner_start_overhead_seconds", "omru_etcd_errors"},
    "executor-0": {"omru_executor_job_state", "omru_executor_job_epochs_done", "omru_executor_job_world_size",
                   "omru_executor_job_gpus", "omru_executor_job_restarts", "omru_executor_job_epoch_seconds",
                   "omru_executor_job_last_epoch_seconds", "omru_executor_gpus", "omru_executor_gpus_held",
                   "omru_executor_gpus_free", "omru_executor_events"},
}


def test_the_families_listed_here_are_those_the_collectors_describe():
    described = exported_families()
    assert {name: families for name, families in FAMILIES.items()} == {
        name: set(described[name.partition("-")[0]]) for name in FAMILIES}


def curl(address: str, *options: str, scheme: str = "http") -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--max-time", "10", *options, f"{scheme}://{address}/metrics"],
                          capture_output=True, text=True, timeout=30)


def scrape(address: str) -> dict[str, dict[tuple, float]]:
    """family name -> {(sample name, sorted labels): value} of what `curl` reads at address."""
    done = curl(address, "-f")
    assert done.returncode == 0, f"curl {address}: {done.stderr}"
    return {f.name: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples}
            for f in text_string_to_metric_families(done.stdout)}


def value(families: dict, sample: str, **labels) -> float | None:
    family = families.get(sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum"), {})
    return family.get((sample, tuple(sorted(labels.items()))))


async def scrape_until(address: str, check, timeout: float = 120.0, what: str = "") -> dict:
    """Scrape every 0.3 s until check(families) holds; the families then."""
    deadline = time.monotonic() + timeout
    families: dict = {}
    while time.monotonic() < deadline:
        families = await asyncio.to_thread(scrape, address)
        if check(families):
            return families
        await asyncio.sleep(0.3)
    raise AssertionError(f"{what or 'condition'} never held at {address}; last scrape: "
                         f"{ {k: v for k, v in families.items() if k.startswith('omru_')} }")


@pytest.mark.timeout(300)
async def test_every_service_serves_its_families_while_a_job_runs_and_they_follow_it(tmp_path):
    cluster = LocalCluster(nodes=1, slots_per_node=2, planner_port=0, work_dir=tmp_path / "up", ttl_seconds=5,
                           metrics=True)
    await asyncio.to_thread(cluster.start)
    try:
        metrics = cluster.ready_line()["metrics"]
        assert set(metrics) == set(FAMILIES), metrics
        assert len(set(metrics.values())) == len(metrics) and all(a.startswith("127.0.0.1:") for a in metrics.values())
        # the planner leads, and sees the node's 2 slots, before the job comes
        await scrape_until(metrics["planner"], lambda f: value(f, "omru_planner_leader") == 1
                           and value(f, "omru_planner_gpus") == 2, 60, "planner leading over 2 GPUs")
        job = tiny_job("metrics-job", epochs=8, min_gpus=2, max_gpus=2)
        channel = open_channel(cluster.service("planner").address)
        try:
            # no profile given: the profiler measures it first (trials through the planner, on the node)
            await planner_pb2_grpc.PlannerServiceStub(channel).SubmitJobs(planner_pb2.SubmitJobsRequest(jobs=[job]),
                                                                          timeout=10)
        finally:
            await channel.close()

        node = metrics["executor-0"]
        key = dict(node="node-0", job="metrics-job")
        # the node: one epoch done, its GPUs held by the job (its world size), none free
        running = await scrape_until(node, lambda f: (value(f, "omru_executor_job_epochs_done", **key) or 0) >= 1
                                     and value(f, "omru_executor_job_state", **key, state="running") == 1, 180,
                                     "an epoch of the running job")
        assert value(running, "omru_executor_job_world_size", **key) == 2
        assert value(running, "omru_executor_gpus", node="node-0") == 2
        assert value(running, "omru_executor_gpus_held", node="node-0") == 2
        assert value(running, "omru_executor_gpus_free", node="node-0") == 0
        assert value(running, "omru_executor_job_gpus", **key) == 2
        assert value(running, "omru_executor_job_epoch_seconds_count", **key) >= 1
        assert 0 < value(running, "omru_executor_job_last_epoch_seconds", **key) < 60
        assert value(running, "omru_executor_events_total", node="node-0", kind="started") >= 1
        first = value(running, "omru_executor_job_epochs_done", **key)

        # the planner, while the job runs: it planned (reconciled, timed the plan), claimed 2 GPUs
        planner = await asyncio.to_thread(scrape, metrics["planner"])
        assert value(planner, "omru_planner_reconciles_total") >= 1
        assert value(planner, "omru_planner_plan_seconds_count") >= 1
        assert value(planner, "omru_planner_claim_seconds_count", outcome="claimed") >= 1
        assert value(planner, "omru_planner_jobs", state="RUNNING") == 1
        assert value(planner, "omru_planner_queue_length") == 0
        assert value(planner, "omru_planner_gpus_owned") == 2
        assert value(planner, "omru_planner_job_world_size", job="metrics-job") == 2
        assert value(planner, "omru_planner_job_epochs", job="metrics-job") == 8
        assert value(planner, "omru_planner_job_state", job="metrics-job", state="RUNNING") == 1
        assert value(planner, "omru_planner_plan_version") >= 1

        # the registry: the node's lease renewed, its 2 GPUs live and claimed
        registry = await asyncio.to_thread(scrape, metrics["registry"])
        assert value(registry, "omru_registry_lease_renewals_total", outcome="ok") >= 1
        assert value(registry, "omru_registry_registrations_total", outcome="ok") >= 1
        assert value(registry, "omru_registry_nodes") == 1
        assert value(registry, "omru_registry_gpus", node="node-0") == 2
        assert value(registry, "omru_registry_gpus_claimed", node="node-0") == 2

        # the profiler: it measured the job's profile, one trial per GPU count
        profiler = await asyncio.to_thread(scrape, metrics["profiler"])
        assert value(profiler, "omru_profiler_trials_total", outcome="measured") >= 1
        assert value(profiler, "omru_profiler_trial_seconds_count") >= 1
        assert value(profiler, "omru_profiler_profiles_total", outcome="measured") == 1
        assert value(profiler, "omru_profiler_profile_seconds_count") == 1

        # every service's families are all there
        for name, address in metrics.items():
            exported = set(await asyncio.to_thread(scrape, address))
            assert FAMILIES[name] <= exported, (name, FAMILIES[name] - exported)
            assert "process_cpu_seconds" in exported, name

        # epochs go on: the count rises while the job trains
        await scrape_until(node, lambda f: (value(f, "omru_executor_job_epochs_done", **key) or 0) > first, 120,
                           "a later epoch")
        # and once it finished, its GPUs are free again and the planner's epochs reached the end
        done = await scrape_until(node, lambda f: value(f, "omru_executor_job_state", **key, state="finished") == 1,
                                  180, "the job finished")
        assert value(done, "omru_executor_job_epochs_done", **key) == 8
        assert value(done, "omru_executor_job_epoch_seconds_count", **key) == 8
        assert value(done, "omru_executor_gpus_free", node="node-0") == 2
        await scrape_until(metrics["planner"], lambda f: value(f, "omru_planner_jobs", state="FINISHED") == 1
                           and value(f, "omru_planner_gpus_owned") == 0, 60, "the planner saw it finish")
    finally:
        await asyncio.to_thread(cluster.stop)


async def test_the_metrics_want_the_bearer_token_when_the_service_has_one(etcd):
    from services.common import config as cfg
    from services.registry.server import start

    running = await start(cfg.RegistryConfig(server=cfg.ServerConfig(auth_token="s3cret", metrics_port=0),
                                             etcd=cfg.EtcdConfig(endpoint=etcd.endpoint)))
    try:
        address = running.metrics.address
        refused = await asyncio.to_thread(curl, address, "-w", "%{http_code}", "-o", "/dev/null")
        assert refused.stdout == "401"
        wrong = await asyncio.to_thread(curl, address, "-H", "Authorization: Bearer nope", "-w", "%{http_code}")
        assert wrong.stdout.endswith("401") and "wrong bearer token" in wrong.stdout
        served = await asyncio.to_thread(curl, address, "-f", "-H", "Authorization: Bearer s3cret")
        assert served.returncode == 0 and "omru_registry_nodes 0.0" in served.stdout
    finally:
        await running.stop(0)
    gone = await asyncio.to_thread(curl, address, "-H", "Authorization: Bearer s3cret")
    assert gone.returncode != 0  # stopped with the service


async def test_the_metrics_answer_an_admins_or_a_scrapers_token_and_no_other_role(etcd):
    """authz.METRICS_READERS: with a tokens file, an admin's and a `metrics` token read /metrics (401 without a
    known token, 403 naming the role for the others); a `metrics` token calls no RPC."""
    import grpc

    from omru.v1 import registry_pb2, registry_pb2_grpc
    from services.common import authz
    from services.common import config as cfg
    from services.common.channels import open_channel
    from services.registry.server import start

    tokens = {"tok-root": authz.Principal(authz.ADMIN, "root"), "tok-prom": authz.Principal(authz.METRICS, "prometheus"),
              "tok-alice": authz.Principal(authz.USER, "alice"), "tok-planner": authz.Principal(authz.PLANNER, "planner"),
              "tok-n1": authz.Principal(authz.NODE, "n1")}
    running = await start(cfg.RegistryConfig(server=cfg.ServerConfig(tokens=tokens, metrics_port=0),
                                             etcd=cfg.EtcdConfig(endpoint=etcd.endpoint)))
    try:
        codes = {}
        for token in (None, "nope", *tokens):
            header = ("-H", f"Authorization: Bearer {token}") if token else ()
            done = await asyncio.to_thread(curl, running.metrics.address, *header, "-w", "\n%{http_code}")
            body, _, code = done.stdout.rpartition("\n")
            codes[token] = code
            assert ("omru_registry_nodes" in body) == (code == "200"), (token, body[-300:])
            if code == "403":
                assert f"{tokens[token]} may not read metrics (allowed: admin, metrics)" in body
        assert codes == {None: "401", "nope": "401", "tok-root": "200", "tok-prom": "200", "tok-alice": "403",
                         "tok-planner": "403", "tok-n1": "403"}
        async with open_channel(running.address, token="tok-prom") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await registry_pb2_grpc.RegistryServiceStub(channel).ListNodes(registry_pb2.ListNodesRequest(), timeout=5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await running.stop(0)


async def test_with_tls_the_metrics_are_served_over_https_to_clients_the_ca_signed(etcd, tmp_path):
    """As deployed (deploy/prometheus/prometheus.yml): mutual TLS with deploy/make-certs.sh's certificates and
    the token; a client without a certificate of the CA, or speaking plain HTTP, is refused, and neither
    stops the next scrape."""
    from services.common import config as cfg
    from services.common.cluster import REPO_ROOT
    from services.registry.server import start

    certs = tmp_path / "certs"
    subprocess.run(["bash", str(REPO_ROOT / "deploy" / "make-certs.sh"), str(certs), "127.0.0.1"], check=True,
                   capture_output=True, timeout=120)
    token = (certs / "token").read_text().strip()
    tls = cfg.TlsConfig(certs / "registry.pem", certs / "registry-key.pem", certs / "ca.pem")
    running = await start(cfg.RegistryConfig(server=cfg.ServerConfig(tls=tls, auth_token=token, metrics_port=0),
                                             etcd=cfg.EtcdConfig(endpoint=etcd.endpoint)))
    try:
        address = running.metrics.address
        https = ("--cacert", str(certs / "ca.pem"), "-H", f"Authorization: Bearer {token}")
        client = ("--cert", str(certs / "client.pem"), "--key", str(certs / "client-key.pem"))
        plain = await asyncio.to_thread(curl, address, "-H", f"Authorization: Bearer {token}")
        assert plain.returncode != 0
        no_cert = await asyncio.to_thread(curl, address, *https, scheme="https")
        assert no_cert.returncode != 0 or "omru_" not in no_cert.stdout, no_cert
        served = await asyncio.to_thread(curl, address, "-f", *https, *client, scheme="https")
        assert served.returncode == 0 and "omru_registry_nodes 0.0" in served.stdout, served.stderr
    finally:
        await running.stop(0)


@pytest.mark.parametrize("bad", ["-1", "65536", "many"])
def test_a_bad_metrics_port_exits_2_naming_it(bad):
    done = subprocess.run([sys.executable, "-m", "services.registry.server", "--etcd", "127.0.0.1:1",
                           "--metrics-port", bad], capture_output=True, text=True, timeout=60, env=child_env())
    assert done.returncode == 2
    assert "--metrics-port" in done.stderr and bad in done.stderr, done.stderr


async def test_failed_etcd_calls_are_counted_by_operation_and_kind_and_a_fenced_write_too(etcd):
    from services.common.etcd import EtcdStore, EtcdUnavailable, Fenced
    from services.common.metrics import EtcdErrors, MetricsServer, new_registry

    store = EtcdStore(etcd.endpoint, timeout=1.0)
    await store.connect()
    server = MetricsServer(new_registry(EtcdErrors(store))).start()
    try:
        await store.put("k", b"v")
        fenced = store.fenced("leader", 12345)  # a fence key this store never created: its writes are refused
        with pytest.raises(Fenced):
            await fenced.put("k", b"w")
        etcd.stop()
        for _ in range(2):
            with pytest.raises(EtcdUnavailable):
                await store.get("k")
        with pytest.raises(EtcdUnavailable):
            await fenced.list("")  # a view's failures count in its store's errors
        families = await asyncio.to_thread(scrape, server.address)
        errors = families["omru_etcd_errors"]
        assert value(families, "omru_etcd_errors_total", op="put", kind="fenced") == 1
        gets = {labels: n for (sample, labels), n in errors.items() if sample.endswith("_total") and ("op", "get") in labels}
        assert sum(gets.values()) == 2 and all(dict(k)["kind"] in ("unavailable", "timeout", "deadline_exceeded",
                                                                   "connection_failed", "connection_timeout") for k in gets), gets
        assert any(("op", "list") in labels for _, labels in errors)
    finally:
        server.stop()
        await store.close()
