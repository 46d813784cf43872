"""Entry point of a node's executor: `python -m services.executor.server --node-id N --registry HOST:PORT`.

Starts the ExecutorService (health, reflection), then registers the node
with its GPUs (NVML) or `--slots` CPU slots in the registry and keeps its
lease alive; SIGTERM/SIGINT deregisters and stops.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from omru.v1 import executor_pb2, executor_pb2_grpc
from services.common import config as cfg
from services.common import gpus
from services.common.channels import open_channel
from services.common.server import RunningServer, Service, run_main, serve_forever, service_name, start_server
from services.executor.convert import Roots
from services.executor.servicer import AllocationWatch, ExecutorServicer, RegistryNodes, devices_of
from services.executor.supervisor import Supervisor
from services.registry.membership import NodeMembership


async def start(config: cfg.ExecutorConfig, servicer=None, runtime=None,
                node_gpus: list | None = None) -> tuple[RunningServer, NodeMembership]:
    """Start the executor and register its node; returns the server and the membership.

    Unless a servicer is given, the ExecutorService runs a Supervisor that
    keeps the node's workers at its allocations (AllocationWatch; the lease
    file the workers read follows the node's lease, and a lost lease ends
    every allocated job at once; profiling trials are allocations too);
    allocations name folders only under the config's checkpoint root and
    data roots.
    Stopping the server stops the watch, then every worker, then
    deregisters the node. runtime and node_gpus replace the worker processes
    and the detected GPUs (the emulated cluster, services/executor/emulated.py).
    """
    node_gpus = node_gpus if node_gpus is not None else gpus.detect(config.slots)
    roots = Roots(str(config.checkpoint_root), tuple(map(str, config.data_roots)))
    tls = config.server.client_tls
    # the node runs what the registry's allocations say: with TLS, only a registry's certificate will do
    channel = open_channel(config.registry, token=config.server.call_token, tls=tls,
                           server_name=config.registry_identity if tls is not None else "")
    supervisor = None
    if servicer is None:
        supervisor = Supervisor(config.node_id, devices_of(node_gpus), RegistryNodes(channel),
                                work_dir=config.work_dir, max_restarts=config.max_restarts,
                                warm_workers=config.warm_workers, runtime=runtime)
        servicer = ExecutorServicer(supervisor)
    service = Service(executor_pb2_grpc.add_ExecutorServiceServicer_to_server, servicer, service_name(executor_pb2, "ExecutorService"))
    running = await start_server(config.server, [service])
    host = config.advertise_host or (config.server.host if config.server.host not in ("0.0.0.0", "[::]") else socket.gethostname())
    membership = NodeMembership(channel, config.node_id, f"{host}:{running.port}", node_gpus, config.ttl_seconds,
                                **(dict(on_renewed=supervisor.renewed, on_lost=supervisor.fence) if supervisor else {}))
    try:
        await membership.start()
    except BaseException:
        await running.stop(0)
        await channel.close()
        raise
    if supervisor is not None:
        watch = AllocationWatch(channel, supervisor, roots=roots)
        watch.start()
        running.on_stop.append(watch.stop)
        await supervisor.warm_up()
        running.on_stop.append(supervisor.close)
    running.on_stop.append(membership.stop)
    running.on_stop.append(channel.close)
    await _start_metrics(running, config, supervisor)
    return running, membership


async def _start_metrics(running: RunningServer, config: cfg.ExecutorConfig, supervisor) -> None:
    """The node's metrics (services/executor/metrics.py) when config.server asks for them."""
    from services.common.metrics import LoopBridge, start_metrics
    from services.executor.metrics import ExecutorCollector

    collector = ExecutorCollector(config.node_id, supervisor, LoopBridge()) if supervisor is not None else None
    await start_metrics(running, config.server, collector)


async def serve(config: cfg.ExecutorConfig) -> None:
    """Run the executor until SIGTERM/SIGINT."""
    running, membership = await start(config)
    await serve_forever(running, "executor", node_id=config.node_id, gpus=len(membership.gpus), lease_id=membership.lease_id)


def parse_config(argv: list[str] | None, env) -> cfg.ExecutorConfig:
    parser = argparse.ArgumentParser(prog="python -m services.executor.server", description=__doc__.splitlines()[0])
    cfg.add_server_args(parser)
    parser.add_argument("--node-id", default=socket.gethostname(), help="id of this node (default: the host name)")
    parser.add_argument("--registry", required=True, help="registry address host:port")
    parser.add_argument("--slots", type=int, default=2, help="CPU slots to offer when NVML finds no GPU")
    parser.add_argument("--ttl", type=int, default=5, help="node lease TTL in seconds")
    parser.add_argument("--advertise-host", default="", help="host other nodes reach this executor at")
    parser.add_argument("--work-dir", default=None, help="directory for worker files and checkpoints")
    parser.add_argument("--checkpoint-root", default=None,
                        help="folder the checkpoint folders of directives must lie under, as the planner's "
                             "--checkpoint-root (default: <tmp>/omru-checkpoints, the planner's default)")
    parser.add_argument("--data-roots", default=env.get(cfg.DATA_ROOTS_ENV, ""),
                        help="colon-separated folders imagefolder:/clips: data sets must lie under "
                             f"(default: ${cfg.DATA_ROOTS_ENV}, else none: only the built-in data sets)")
    parser.add_argument("--max-restarts", type=int, default=2, help="restarts of a job after worker failures before it fails")
    parser.add_argument("--no-warm-workers", action="store_true",
                        help="start every worker cold (default: one waits per device with torch imported)")
    parser.add_argument("--registry-identity", default=cfg.REGISTRY_IDENTITY,
                        help="with --tls-ca: certificate name of the registry, whose allocations this node follows")
    args = parser.parse_args(argv)
    return cfg.ExecutorConfig(
        node_id=args.node_id,
        server=cfg.server_config_from_args(args, env),
        registry=args.registry,
        slots=args.slots,
        ttl_seconds=args.ttl,
        advertise_host=args.advertise_host,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        max_restarts=args.max_restarts,
        warm_workers=not args.no_warm_workers,
        registry_identity=args.registry_identity,
        checkpoint_root=args.checkpoint_root,
        data_roots=cfg.split_roots(args.data_roots),
    )


def main(argv: list[str] | None = None) -> int:
    return run_main("executor", parse_config, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
