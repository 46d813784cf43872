"""The deployment files, checked without a container engine: the Dockerfile's
layout (what it copies exists and reaches the build context, non-root user,
etcd's data folder, a head image without torch, a health check, pinned base
and versioned tags) and every compose file (health checks that probe the
service's own port, start order on health, log rotation, one shared
checkpoint path for the planner and the executors). `.ci/run` also has
docker-compose validate each compose file."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from platform_helpers import exported_families, sample_names
from services.common.cluster import REPO_ROOT, child_env

DEPLOY = REPO_ROOT / "deploy"
COMPOSE_FILES = sorted(DEPLOY.glob("*.compose.yml"))
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
#: What only training needs: none of it may reach the head image.
TRAINING_ONLY = ("torch", "torchvision", "triton", "nvidia-", "cuda-", "nvidia-ml-py", "matplotlib", "scikit-learn")


def name_of(requirement: str) -> str:
    """The canonical distribution name of a requirement line ("PyYAML==6.0.3" -> "pyyaml")."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group(0)).lower()


def stages() -> dict[str, list[tuple[str, str]]]:
    """Dockerfile stage name -> its (INSTRUCTION, arguments), continuation lines joined, comments dropped;
    "" holds what comes before the first FROM."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in (DEPLOY / "Dockerfile").read_text().splitlines()
                                          if not line.lstrip().startswith("#")))
    out: dict[str, list[tuple[str, str]]] = {"": []}
    current = ""
    for line in filter(str.strip, text.splitlines()):
        instruction, _, args = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", args.strip(), re.IGNORECASE)
            current = m.group(2) or f"stage{len(out)}"
            out[current] = []
        out[current].append((instruction.upper(), args.strip()))
    return out


def chain(all_stages, name: str) -> list[str]:
    """The stage and the stages it is built FROM, nearest first."""
    names = [name]
    while (base := all_stages[names[-1]][0][1].split()[0]) in all_stages:
        names.append(base)
    return names


def inherited(all_stages, name: str, instruction: str) -> list[str]:
    """Arguments of every `instruction` in the stage and its bases, in build order."""
    return [a for s in reversed(chain(all_stages, name)) for i, a in all_stages[s] if i == instruction]


def test_the_base_image_is_pinned_and_every_stage_builds_on_it_or_another_stage():
    all_stages = stages()
    base = dict(a.split("=", 1) for i, a in all_stages[""] if i == "ARG")["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+", base), base  # python as pyproject requires, patch pinned
    for name, instructions in all_stages.items():
        if name:
            assert instructions[0][1].split()[0] in ("${PYTHON_IMAGE}", *all_stages), (name, instructions[0])


def test_every_copied_source_exists_and_is_let_into_the_build_context():
    allowed = [line[1:].rstrip("/") for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
    sources = []
    for instructions in stages().values():
        for instruction, args in instructions:
            if instruction == "COPY" and not args.startswith("--from="):
                sources += args.split()[:-1]
    assert sources
    for source in sources:
        assert (REPO_ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert any(source == a or source.startswith(a + "/") for a in allowed), f"COPY {source}: .dockerignore drops it"


@pytest.mark.parametrize("image", ["head", "gpu"])
def test_each_image_runs_as_the_non_root_service_user_who_owns_etcds_data_and_has_a_health_check(image):
    all_stages = stages()
    users = inherited(all_stages, image, "USER")
    assert users and users[-1] == "omru", users
    runs = " ".join(inherited(all_stages, image, "RUN"))
    assert re.search(r"useradd .*--uid 10001 .*omru", runs), runs  # etcd's and the services' uid (README)
    made = re.search(r"mkdir -p ([^&]+)", runs).group(1).split()
    for folder in ("/var/lib/omru/etcd", "/var/lib/omru/node", "/var/lib/omru/checkpoints"):
        assert folder in made, made
    assert "chown -R omru:omru /var/lib/omru" in runs
    checks = inherited(all_stages, image, "HEALTHCHECK")
    assert checks and "services.common.health_probe" in checks[-1], checks


def test_the_head_image_installs_the_head_requirements_and_the_package_without_its_dependencies():
    all_stages = stages()
    copied = [a for i, a in all_stages["head"] if i == "COPY" and a.startswith("--from=")]
    assert copied == ["--from=build-head /opt/venv /opt/venv"], copied
    pips = [a for s in chain(all_stages, "build-head") for i, a in all_stages[s] if i == "RUN" and "pip install" in a]
    assert sorted(pips) == sorted(["/opt/venv/bin/pip install -c constraints.txt -r deploy/head-requirements.txt",
                                   "/opt/venv/bin/pip install --no-deps ."]), pips
    assert not any("etcd" in a for i, a in all_stages["gpu"] if i == "RUN")  # etcd runs on the head only


def head_requirements() -> list[str]:
    lines = (DEPLOY / "head-requirements.txt").read_text().splitlines()
    return [name_of(line) for line in lines if line.strip() and not line.startswith("#")]


def test_the_head_requirements_are_dependencies_pinned_by_the_constraints_and_hold_nothing_for_training():
    required = head_requirements()
    dependencies = {name_of(d) for d in PYPROJECT["project"]["dependencies"]}
    pinned = {name_of(line) for line in (REPO_ROOT / "constraints.txt").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    assert required and set(required) <= dependencies & pinned, set(required) - dependencies & pinned
    assert not [r for r in required if r.startswith(TRAINING_ONLY)], required


# Imports every module of the head's services with only the head requirements (and what they
# require) importable, as in the head image; prints what it refused to import.
HEAD_IMPORTS = r"""
import importlib, importlib.abc, importlib.metadata as md, pkgutil, re, sys
def name(r): return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", r).group(0)).lower()
allowed, todo = {"omru"}, list(sys.argv[1:])
while todo:
    d = todo.pop()
    if d not in allowed:
        allowed.add(d)
        todo += [name(r) for r in md.requires(d) or () if "extra ==" not in r]
blocked = {m for m, ds in md.packages_distributions().items() if not {name(d) for d in ds} & allowed}
refused = set()
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in blocked:
            refused.add(fullname.split(".")[0])
            raise ModuleNotFoundError(f"not in the head image: {fullname}", name=fullname)
sys.meta_path.insert(0, Block())
try:
    import torch
    raise SystemExit("torch imported")
except ModuleNotFoundError:
    pass
for pkg in ("services.common", "services.registry", "services.profiler", "services.planner"):
    m = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(m.__path__, pkg + "."):
        importlib.import_module(info.name)
print(" ".join(sorted(refused)))
"""


def test_every_module_of_the_head_services_imports_with_the_head_requirements_alone():
    done = subprocess.run([sys.executable, "-c", HEAD_IMPORTS, *head_requirements()], cwd=REPO_ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch" in done.stdout.split()  # the fence held (grpc's optional grpc_tools may be refused too)


def compose(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def command(service: dict) -> str:
    return " ".join(service["command"].split()) if isinstance(service["command"], str) else " ".join(service["command"])


def default_image(service: dict) -> str:
    return re.fullmatch(r"\$\{\w+:-([^}]+)\}", service["image"]).group(1)


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_every_compose_service_is_health_checked_on_its_own_port_rotates_its_logs_and_starts_after_healthy_ones(path):
    spec = compose(path)
    assert "version" not in spec  # obsolete in the Compose specification
    assert spec["services"]
    for name, service in spec["services"].items():
        test = service["healthcheck"]["test"]
        assert test[:4] == ["CMD", "python", "-m", "services.common.health_probe"], (name, test)
        port = test[4].rpartition(":")[2]
        own = re.search(r"--port (\d+)", command(service)) or re.search(r"--listen-client-urls \S+:(\d+)", command(service))
        assert own and own.group(1) == port, (name, test, command(service))
        if "--tls-ca" in command(service) or "--trusted-ca-file" in command(service):  # mutual TLS: a certificate
            assert "--tls-cert" in test and "--tls-key" in test, (name, test)
        logging = service["logging"]
        assert logging["driver"] == "json-file" and {"max-size", "max-file"} <= set(logging["options"]), (name, logging)
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict) and all(d["condition"] == "service_healthy" for d in depends.values()), depends
        assert "shm_size" not in service or service.get("ipc") != "host", name  # ignored under the host's IPC
        assert default_image(service).endswith(f":{VERSION}"), (name, service["image"])


def mounts(service: dict) -> dict[str, str]:
    """Container path -> what is mounted there (short syntax SOURCE:TARGET[:MODE]; a source may hold ${A:-b})."""
    out = {}
    for volume in service.get("volumes", []):
        parts = volume.split(":")
        if parts[-1] in ("ro", "rw"):
            parts.pop()
        out[parts[-1]] = ":".join(parts[:-1])
    return out


def test_the_planner_checkpoint_root_is_the_shared_storage_every_executor_mounts_at_the_same_path():
    head = compose(DEPLOY / "head.compose.yml")["services"]
    executor = compose(DEPLOY / "gpu-node.compose.yml")["services"]["executor"]
    root = re.search(r"--checkpoint-root (\S+)", command(head["planner"])).group(1)
    assert mounts(head["planner"]).get(root) == mounts(executor).get(root) == "${OMRU_CHECKPOINTS:-/shared/omru}"
    work = re.search(r"--work-dir (\S+)", command(executor)).group(1)
    assert not work.startswith(root) and mounts(executor)[work] == "omru-node"  # a node's lease and logs are its own
    assert {default_image(s).split(":")[0] for s in head.values()} == {"omru-head"}
    assert default_image(executor).split(":")[0] == "omru-gpu"


def test_etcds_volume_is_mounted_where_it_keeps_its_data():
    for path in (DEPLOY / "head.compose.yml", DEPLOY / "etcd-cluster.compose.yml"):
        etcd = compose(path)["services"]["etcd"]
        data = re.search(r"--data-dir (\S+)", command(etcd)).group(1)
        assert data == "/var/lib/omru/etcd" and mounts(etcd)[data] == "etcd-data", (path.name, mounts(etcd))


# --- metrics: the Grafana dashboard and the Prometheus scrape configuration ---------------------------

DASHBOARD = DEPLOY / "grafana" / "omru.json"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"


def dashboard_queries() -> list[str]:
    """The PromQL expression of every panel target of the dashboard (rows' panels too)."""
    import json

    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    return [t["expr"] for p in panels(json.loads(DASHBOARD.read_text())["panels"]) for t in p.get("targets", [])]


def test_every_metric_the_dashboard_queries_is_one_a_service_exports():
    exported = {name for families in exported_families().values() for family, kind in families.items()
                for name in sample_names(family, kind)}
    queries = dashboard_queries()
    assert len(queries) >= 10
    named = {m for q in queries for m in re.findall(r"\b(omru_[a-z_]+)", q)}
    assert named and not named - exported, sorted(named - exported)
    # and the dashboard shows what operators look for: jobs, GPUs, the planner, the registry, etcd
    families = {re.sub(r"_(total|bucket|count|sum)$", "", m) for m in named}
    assert {"omru_executor_job_epoch_seconds", "omru_executor_job_epochs_done", "omru_planner_job_world_size",
            "omru_executor_gpus_held", "omru_executor_gpus_free", "omru_planner_reconciles", "omru_planner_plan_seconds",
            "omru_planner_queue_length", "omru_registry_lease_renewals", "omru_planner_claim_seconds",
            "omru_etcd_errors"} <= families, families


def test_every_service_of_the_compose_files_serves_metrics_where_prometheus_scrapes_them():
    config = yaml.safe_load(PROMETHEUS.read_text())
    scraped = {}
    for job in config["scrape_configs"]:
        assert job["scheme"] == "https" and "credentials_file" in job["authorization"], job  # as the services serve
        assert {"ca_file", "cert_file", "key_file"} <= set(job["tls_config"]), job  # mutual TLS
        for group in job["static_configs"]:
            for target in group["targets"]:
                scraped.setdefault(group["labels"]["service"], set()).add(int(target.rpartition(":")[2]))
    served = {}
    for path in (DEPLOY / "head.compose.yml", DEPLOY / "gpu-node.compose.yml"):
        for name, service in compose(path)["services"].items():
            if "services." in command(service):
                port = re.search(r"--metrics-port (\d+)", command(service))
                assert port, (path.name, name)
                served[name] = {int(port.group(1))}
    assert served == scraped and set(served) == {"planner", "registry", "profiler", "executor"}, (served, scraped)
    ports = [p for ps in served.values() for p in ps]
    assert len(set(ports)) == len(ports)  # on one host, each its own


# --- certificates: what make-certs.sh issues and what each container mounts -----------------------------

NODE = "192.0.2.2"  # a node id as the compose files default it: the node's address


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """make-certs.sh's output for a head and one node (openssl)."""
    out = tmp_path_factory.mktemp("deploy-certs") / "certs"
    subprocess.run(["bash", str(DEPLOY / "make-certs.sh"), str(out), "192.0.2.1", NODE], check=True, capture_output=True,
                   env={"OMRU_NODES": f"{NODE} gpu-b", "PATH": "/usr/bin:/bin"}, timeout=120)
    return out


def x509(path: Path) -> str:
    return subprocess.run(["openssl", "x509", "-in", str(path), "-noout", "-text"], check=True, capture_output=True,
                          text=True).stdout


def usages(path: Path) -> set[str]:
    """The extended key usages of a certificate, as openssl names them."""
    text = x509(path)
    line = text.split("X509v3 Extended Key Usage:")[1].splitlines()[1]
    return {u.strip() for u in line.split(",")}


def verifies(ca: Path, cert: Path) -> bool:
    return subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(cert)], capture_output=True).returncode == 0


SERVER_AND_CLIENT = {"TLS Web Server Authentication", "TLS Web Client Authentication"}
CLIENT_ONLY = {"TLS Web Client Authentication"}


def test_make_certs_limits_each_certificate_to_its_use_and_gives_etcd_a_ca_of_its_own(certs):
    issued = {p.name for p in certs.glob("*.pem")}
    assert "executor.pem" not in issued  # no certificate shared by every node
    assert {f"executor-{NODE}.pem", "executor-gpu-b.pem"} <= issued
    assert not list(certs.glob("*ca-key.pem")) and {p.name for p in (certs / "private").iterdir()} == {
        "ca-key.pem", "etcd-ca-key.pem"}  # CA keys apart, in the folder no node gets
    assert (certs / "private").stat().st_mode & 0o077 == 0
    assert all((certs / f).stat().st_mode & 0o077 == 0 for f in ("token", "metrics-token", "metrics.tokens"))
    for name in ("client", "etcd-registry", "etcd-profiler", "etcd-planner"):
        assert usages(certs / f"{name}.pem") == CLIENT_ONLY, name
        assert "Subject Alternative Name" not in x509(certs / f"{name}.pem"), name  # no host to serve
    for name in ("registry", "profiler", "planner", "etcd", f"executor-{NODE}", "executor-gpu-b"):
        assert usages(certs / f"{name}.pem") == SERVER_AND_CLIENT, name
        assert "CA:FALSE" in x509(certs / f"{name}.pem")
    # etcd trusts its own CA: the services' etcd certificates pass, a user's, a node's, a service's gRPC one do not
    etcd_ca = certs / "etcd-ca.pem"
    assert all(verifies(etcd_ca, certs / f"{n}.pem") for n in ("etcd", "etcd-registry", "etcd-profiler", "etcd-planner"))
    assert not any(verifies(etcd_ca, certs / f"{n}.pem") for n in ("client", f"executor-{NODE}", "registry"))
    assert verifies(certs / "ca.pem", certs / "client.pem") and not verifies(certs / "ca.pem", certs / "etcd-registry.pem")
    # a node's certificate names that node (CN) and its own address, not the head's or another node's
    node = x509(certs / f"executor-{NODE}.pem")
    assert f"CN = omru-executor-{NODE}" in node and f"IP Address:{NODE}" in node and "192.0.2.1" not in node
    assert "DNS:gpu-b" in x509(certs / "executor-gpu-b.pem") and NODE not in x509(certs / "executor-gpu-b.pem")


def test_make_certs_refuses_a_node_id_that_is_no_id_before_writing_anything(tmp_path):
    done = subprocess.run(["bash", str(DEPLOY / "make-certs.sh"), str(tmp_path / "c"), "192.0.2.1"], capture_output=True,
                          text=True, env={"OMRU_NODES": "good ../bad", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 2 and "node id '../bad'" in done.stderr and not (tmp_path / "c").exists()


def cert_mounts(service: dict) -> dict[str, str]:
    """/certs/<file> in the container -> the file of ./certs mounted there (a whole folder fails the test)."""
    out = {}
    for target, source in mounts(service).items():
        if "certs" in source:
            assert source.startswith("./certs/") and target.startswith("/certs/"), (source, target)  # files, no folder
            out[target] = source.removeprefix("./certs/")
    return out


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_each_container_mounts_only_the_certificate_files_it_uses_and_they_are_issued(path, certs):
    node_id = "${OMRU_NODE_ID:-${OMRU_NODE}}"
    for name, service in compose(path)["services"].items():
        files = cert_mounts(service)
        used = set(re.findall(r"/certs/[\w.-]+", command(service) + " " + " ".join(service["healthcheck"]["test"])))
        assert used == set(files), (path.name, name, used ^ set(files))  # each one used, each used one mounted
        for source in files.values():
            assert (certs / source.replace(node_id, NODE)).is_file(), (path.name, name, source)
        if "etcd " in command(service) or "--etcd-cert" in command(service):  # etcd and its clients: etcd's CA
            assert {"/certs/etcd-ca.pem"} <= set(files) and not {"client.pem", "executor.pem"} & set(files.values())
        assert "private" not in " ".join(files.values())


def test_a_gpu_node_mounts_the_ca_and_its_own_certificate_alone_and_no_token():
    executor = compose(DEPLOY / "gpu-node.compose.yml")["services"]["executor"]
    node_id = "${OMRU_NODE_ID:-${OMRU_NODE}}"
    assert sorted(cert_mounts(executor).values()) == sorted(["ca.pem", f"executor-{node_id}.pem",
                                                             f"executor-{node_id}-key.pem", "metrics.tokens"])
    assert f"--node-id {node_id}".replace("${OMRU_NODE}", "${OMRU_NODE:?set OMRU_NODE}") in command(executor)
    assert "--auth-token-file" not in command(executor) and "OMRU_AUTH_TOKEN" not in str(executor.get("environment"))


def test_the_scraper_token_is_of_the_metrics_role_and_prometheus_sends_it(certs):
    from services.common import authz

    (token, principal), = authz.read_tokens(certs / "metrics.tokens").items()
    assert principal.kind == authz.METRICS and token == (certs / "metrics-token").read_text().strip()
    assert token != (certs / "token").read_text().strip()
    for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]:
        assert job["authorization"]["credentials_file"].endswith("/metrics-token"), job
    for path in (DEPLOY / "head.compose.yml", DEPLOY / "gpu-node.compose.yml"):
        for name, service in compose(path)["services"].items():
            if "--metrics-port" in command(service):
                assert "--auth-tokens /certs/metrics.tokens" in command(service), (path.name, name)


def test_etcd_trusts_only_its_own_ca_in_every_compose_file():
    for path in (DEPLOY / "head.compose.yml", DEPLOY / "etcd-cluster.compose.yml"):
        etcd = command(compose(path)["services"]["etcd"])
        assert "--client-cert-auth" in etcd and "--trusted-ca-file /certs/etcd-ca.pem" in etcd, path.name
        assert "--peer-trusted-ca-file" not in etcd or "--peer-trusted-ca-file /certs/etcd-ca.pem" in etcd
    for name, service in compose(DEPLOY / "head.compose.yml")["services"].items():
        if name != "etcd":
            assert f"--etcd-ca /certs/etcd-ca.pem --etcd-cert /certs/etcd-{name}.pem" in command(service), name
