"""The container health check, `python -m services.common.health_probe`,
against real servers: exit 0 while a server serves, 1 while it stops, when it
is gone, behind mutual TLS without a certificate; etcd answers it too (the
compose files probe etcd with it)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from services.common import config as cfg
from services.common.cluster import REPO_ROOT, child_env
from services.common.server import start_server


async def probe(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(exit code, output) of the probe process (asynchronous: the server under test runs on this loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.common.health_probe", *args, cwd=REPO_ROOT, env=child_env(env),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode()


async def test_the_probe_passes_while_the_server_serves_and_fails_while_it_stops_and_once_it_is_gone():
    running = await start_server(cfg.ServerConfig(port=0), [])
    try:
        assert await probe(running.address, "--timeout", "3") == (0, f"{running.address}: SERVING\n")
        await running.health.enter_graceful_shutdown()
        assert await probe(running.address, "--timeout", "3") == (1, f"{running.address}: NOT_SERVING\n")
    finally:
        await running.server.stop(0)
    code, out = await probe(running.address, "--timeout", "2")
    assert code == 1 and out.startswith(f"{running.address}: no answer: UNAVAILABLE"), out


async def test_without_an_address_the_probe_fails_naming_what_is_missing():
    code, out = await probe(env={"OMRU_HEALTH_ADDRESS": ""})
    assert code == 1 and "no address: give HOST:PORT or set $OMRU_HEALTH_ADDRESS" in out, out


async def test_etcd_answers_the_probe(etcd):
    assert await probe(etcd.endpoint, "--timeout", "3") == (0, f"{etcd.endpoint}: SERVING\n")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(REPO_ROOT / "deploy" / "make-certs.sh"), str(out), "127.0.0.1"], check=True,
                   capture_output=True)
    return out


async def test_behind_mutual_tls_the_probe_needs_a_certificate_of_the_ca(certs):
    own = cfg.TlsConfig(certs / "registry.pem", certs / "registry-key.pem", certs / "ca.pem")
    running = await start_server(cfg.ServerConfig(port=0, tls=own, auth_token="t"), [])
    try:
        # as the compose files call it: flags; as the image's HEALTHCHECK does: the environment
        flags = ("--tls-ca", str(certs / "ca.pem"), "--tls-cert", str(certs / "registry.pem"),
                 "--tls-key", str(certs / "registry-key.pem"))
        assert await probe(running.address, *flags) == (0, f"{running.address}: SERVING\n")
        env = {"OMRU_HEALTH_ADDRESS": running.address, "OMRU_TLS_CA": str(certs / "ca.pem"),
               "OMRU_TLS_CERT": str(certs / "registry.pem"), "OMRU_TLS_KEY": str(certs / "registry-key.pem")}
        assert await probe(env=env) == (0, f"{running.address}: SERVING\n")
        code, out = await probe(running.address, "--timeout", "2", "--tls-ca", str(certs / "ca.pem"))
        assert code == 1 and "no answer" in out, out  # refused in the handshake
    finally:
        await running.server.stop(0)
