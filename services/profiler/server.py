"""Entry point of the profiler: `python -m services.profiler.server --etcd HOST:PORT --registry HOST:PORT`."""

from __future__ import annotations

import argparse

from omru.v1 import profiler_pb2, profiler_pb2_grpc
from services.common import config as cfg
from services.common.server import RunningServer, Service, run_main, serve_forever, service_name, start_server
from services.common.etcd import EtcdStore
from services.common.metrics import EtcdErrors, start_metrics
from services.profiler.servicer import ProfilerServicer
from services.profiler.store import ProfileStore
from services.profiler.trials import PlannerTrials


async def start(config: cfg.ProfilerConfig, servicer=None) -> RunningServer:
    """Start the profiler on config.server (port 0 = any)."""
    hooks = []
    if servicer is None:
        etcd = EtcdStore.from_config(config.etcd)
        await etcd.connect()
        # trials run through the leading planner, found by its leader key in etcd
        trials = PlannerTrials(etcd, config.registry, token=config.server.call_token, tls=config.server.client_tls)
        servicer = ProfilerServicer(ProfileStore(etcd), trials)
        hooks = [trials.close, etcd.close]
    service = Service(profiler_pb2_grpc.add_ProfilerServiceServicer_to_server, servicer, service_name(profiler_pb2, "ProfilerService"))
    running = await start_server(config.server, [service])
    running.on_stop.extend(hooks)
    await start_metrics(running, config.server, getattr(servicer, "meter", None), *([EtcdErrors(etcd)] if hooks else []))
    return running


async def serve(config: cfg.ProfilerConfig) -> None:
    """Run the profiler until SIGTERM/SIGINT."""
    await serve_forever(await start(config), "profiler")


def parse_config(argv: list[str] | None, env) -> cfg.ProfilerConfig:
    parser = argparse.ArgumentParser(prog="python -m services.profiler.server", description=__doc__)
    cfg.add_server_args(parser)
    cfg.add_etcd_args(parser)
    parser.add_argument("--registry", required=True, help="registry address host:port")
    args = parser.parse_args(argv)
    return cfg.ProfilerConfig(server=cfg.server_config_from_args(args, env), etcd=cfg.etcd_config_from_args(args, env),
                              registry=args.registry)


def main(argv: list[str] | None = None) -> int:
    return run_main("profiler", parse_config, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
