"""Shared fixtures: a real etcd on free loopback ports, a real registry
server on port 0, helpers to start service processes and pick free ports.

    etcd              EtcdProcess (function scope, own data dir): .endpoint,
                      .stop(), .start(), .restart(), .kill()
    etcd_store        EtcdStore connected to it (prefix /omru/)
    registry          RunningServer of an in-process registry on that etcd
                      (.address, .port)
    registry_stub     RegistryServiceStub on a channel to it
    free_port         function returning a free loopback port
    start_service     async function(module, *args) -> ServiceProcess that is
                      ready (stopped at teardown); logs under tmp_path

Every test has a context file of its own ($OMRU_CONTEXT under its tmp_path):
an `omru up` a test starts never writes, and no command reads, the user's.
"""

from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from services.common.cluster import EtcdProcess, ServiceProcess, child_env, free_port as _free_port, service_argv, wait_ready  # noqa: E402


@pytest.fixture(autouse=True)
def own_context(tmp_path, monkeypatch):
    """$OMRU_CONTEXT in the test's own folder (omru/context.py)."""
    monkeypatch.setenv("OMRU_CONTEXT", str(tmp_path / "omru-context.json"))


@pytest.fixture
def free_port():
    """A function returning a TCP port that is free on 127.0.0.1 right now."""
    return _free_port


@pytest.fixture
def etcd(tmp_path):
    """A real etcd (Debian's binary) on free loopback ports with a temp data dir."""
    proc = EtcdProcess(tmp_path / "etcd-data", log_file=tmp_path / "etcd.log").start()
    yield proc
    proc.stop()


@pytest.fixture
async def etcd_store(etcd):
    """An EtcdStore on the test etcd."""
    from services.common.etcd import EtcdStore

    store = EtcdStore(etcd.endpoint, "/omru/", timeout=2.0)
    await store.connect()
    yield store
    await store.close()


async def start_registry(endpoint: str, **server_options):
    """An in-process registry on etcd endpoint (port 0 unless given); returns the RunningServer."""
    from services.common import config as cfg
    from services.registry.server import start

    config = cfg.RegistryConfig(server=cfg.ServerConfig(**server_options), etcd=cfg.EtcdConfig(endpoint=endpoint))
    return await start(config)


@pytest.fixture
async def registry(etcd):
    """A real registry server on port 0 against the test etcd."""
    running = await start_registry(etcd.endpoint)
    yield running
    await running.stop(0)


@pytest.fixture
async def registry_stub(registry):
    """A RegistryServiceStub to the registry fixture."""
    from omru.v1 import registry_pb2_grpc
    from services.common.channels import open_channel

    channel = open_channel(registry.address)
    yield registry_pb2_grpc.RegistryServiceStub(channel)
    await channel.close()


@pytest.fixture
def start_service(tmp_path):
    """`await start_service(module, *args)`: run `python -m services.<module>.server *args`, wait until ready."""
    started: list[ServiceProcess] = []

    async def start(module: str, *args: str, name: str | None = None, env: dict | None = None, timeout: float = 30.0) -> ServiceProcess:
        name = name or f"{module}-{len(started)}"
        proc = ServiceProcess(name, service_argv(module, *args), child_env(env), tmp_path / f"{name}.log").spawn()
        started.append(proc)
        # in a thread: an in-process server on this event loop must keep serving meanwhile
        await asyncio.to_thread(wait_ready, [proc], timeout)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()
