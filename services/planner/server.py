"""Entry point of the planner: `python -m services.planner.server --etcd HOST:PORT --registry HOST:PORT --profiler HOST:PORT`."""

from __future__ import annotations

import argparse

from omru.v1 import planner_pb2, planner_pb2_grpc
from services.common import config as cfg
from services.common.server import RunningServer, Service, run_main, serve_forever, service_name, start_server
from services.planner.servicer import PlannerServicer


async def start(config: cfg.PlannerConfig, servicer=None) -> RunningServer:
    """Start the planner on config.server (default port 50051; 0 = any).

    Unless a servicer is given, the PlannerService runs a Dispatcher over the
    planner's state in etcd, talking to the registry and the profiler;
    stopping the server stops the dispatcher, then closes etcd."""
    hooks = []
    dispatcher = None
    if servicer is None:
        from services.common.etcd import EtcdStore
        from services.planner.dispatcher import Dispatcher
        from services.planner.state import PlannerState

        etcd = EtcdStore.from_config(config.etcd)
        await etcd.connect()
        dispatcher = Dispatcher(PlannerState(etcd), config.registry, config.profiler, policy=config.policy,
                                token=config.server.auth_token, tls=config.server.client_tls,
                                checkpoint_root=config.checkpoint_root, start_overhead_s=config.start_overhead_s,
                                time_scale=config.time_scale)
        servicer = PlannerServicer(dispatcher)
        hooks = [dispatcher.stop, etcd.close]
    service = Service(planner_pb2_grpc.add_PlannerServiceServicer_to_server, servicer, service_name(planner_pb2, "PlannerService"))
    if dispatcher is not None:
        await dispatcher.start()  # (it knows the stored jobs before the first request comes)
    try:
        running = await start_server(config.server, [service])
    except BaseException:
        for hook in hooks:
            await hook()
        raise
    running.on_stop.extend(hooks)
    return running


async def serve(config: cfg.PlannerConfig) -> None:
    """Run the planner until SIGTERM/SIGINT."""
    await serve_forever(await start(config), "planner")


def parse_config(argv: list[str] | None, env) -> cfg.PlannerConfig:
    parser = argparse.ArgumentParser(prog="python -m services.planner.server", description=__doc__)
    cfg.add_server_args(parser, default_port=50051)
    cfg.add_etcd_args(parser)
    parser.add_argument("--registry", required=True, help="registry address host:port")
    parser.add_argument("--profiler", required=True, help="profiler address host:port")
    parser.add_argument("--policy", default="", help="default planning policy (default: the planner's own)")
    parser.add_argument("--checkpoint-root", default="",
                        help="folder for the jobs' checkpoints that every node sees (default: <tmp>/omru-checkpoints)")
    parser.add_argument("--start-overhead", type=float, default=4.0,
                        help="seconds a job's start or restart is assumed to cost until one is measured (default 4)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="job seconds per wall second (only for an emulated cluster; default 1)")
    args = parser.parse_args(argv)
    return cfg.PlannerConfig(
        server=cfg.server_config_from_args(args, env),
        etcd=cfg.etcd_config_from_args(args),
        registry=args.registry,
        profiler=args.profiler,
        policy=args.policy,
        checkpoint_root=args.checkpoint_root,
        start_overhead_s=args.start_overhead,
        time_scale=args.time_scale,
    )


def main(argv: list[str] | None = None) -> int:
    return run_main("planner", parse_config, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
