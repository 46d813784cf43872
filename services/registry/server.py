"""Entry point of the registry: `python -m services.registry.server --etcd HOST:PORT`."""

from __future__ import annotations

import argparse

from omru.v1 import registry_pb2, registry_pb2_grpc
from services.common import config as cfg
from services.common.etcd import EtcdStore
from services.common.metrics import EtcdErrors, LoopBridge, start_metrics
from services.common.server import RunningServer, Service, run_main, serve_forever, service_name, start_server
from services.registry.servicer import RegistryServicer
from services.registry.store import RegistryStore


async def start(config: cfg.RegistryConfig) -> RunningServer:
    """Start the registry on config.server (port 0 = any); returns the running server."""
    etcd = EtcdStore.from_config(config.etcd)
    await etcd.connect()
    servicer = RegistryServicer(RegistryStore(etcd), config.max_ttl_seconds)
    service = Service(registry_pb2_grpc.add_RegistryServiceServicer_to_server, servicer, service_name(registry_pb2, "RegistryService"))
    running = await start_server(config.server, [service])
    running.on_stop.append(etcd.close)
    await start_metrics(running, config.server, servicer.meter.bind(servicer.store, LoopBridge()), EtcdErrors(etcd))
    return running


async def serve(config: cfg.RegistryConfig) -> None:
    """Run the registry until SIGTERM/SIGINT."""
    running = await start(config)
    await serve_forever(running, "registry", etcd=config.etcd.endpoint)


def parse_config(argv: list[str] | None, env) -> cfg.RegistryConfig:
    parser = argparse.ArgumentParser(prog="python -m services.registry.server", description=__doc__)
    cfg.add_server_args(parser)
    cfg.add_etcd_args(parser)
    args = parser.parse_args(argv)
    return cfg.RegistryConfig(server=cfg.server_config_from_args(args, env), etcd=cfg.etcd_config_from_args(args, env))


def main(argv: list[str] | None = None) -> int:
    return run_main("registry", parse_config, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
