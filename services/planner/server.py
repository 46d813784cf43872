"""Entry point of the planner: `python -m services.planner.server --etcd HOST:PORT --registry HOST:PORT --profiler HOST:PORT`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import tempfile

from omru.v1 import planner_pb2, planner_pb2_grpc
from services.common import config as cfg
from services.common.config import ConfigError
from services.common.logging import get_logger
from services.common.server import RunningServer, Service, run_main, serve_forever, service_name, start_server
from services.planner.servicer import PlannerServicer

log = get_logger(__name__)


async def start(config: cfg.PlannerConfig, servicer=None) -> RunningServer:
    """Start the planner on config.server (default port 50051; 0 = any).

    Unless a servicer is given, the PlannerService runs a Dispatcher over the
    planner's state in etcd, talking to the registry and the profiler, once
    this planner is elected leader (`lead`); until then it is on standby
    (reads are served, writes refused). Stopping the server stops the
    dispatcher, resigns, then closes etcd."""
    dispatcher = None
    if servicer is None:
        from services.common.etcd import EtcdStore
        from services.planner.dispatcher import Dispatcher
        from services.planner.state import PlannerState

        etcd = EtcdStore.from_config(config.etcd)
        await etcd.connect()
        dispatcher = Dispatcher(PlannerState(etcd), config.registry, config.profiler, policy=config.policy,
                                token=config.server.call_token, tls=config.server.client_tls,
                                checkpoint_root=config.checkpoint_root, start_overhead_s=config.start_overhead_s,
                                time_scale=config.time_scale, trial_timeout_s=config.trial_timeout_s,
                                checkpoint_retention_s=config.checkpoint_retention_s)
        servicer = PlannerServicer(dispatcher)
    service = Service(planner_pb2_grpc.add_PlannerServiceServicer_to_server, servicer, service_name(planner_pb2, "PlannerService"))
    running = await start_server(config.server, [service])
    if dispatcher is not None:
        dispatcher.state.meter = dispatcher.meter
        task = asyncio.get_running_loop().create_task(lead(etcd, dispatcher, config, running.address))
        running.on_stop.extend([lambda: _cancel(task), dispatcher.stop, etcd.close])
        from services.common.metrics import EtcdErrors, LoopBridge, start_metrics

        await start_metrics(running, config.server, dispatcher.meter.bind(dispatcher, LoopBridge()), EtcdErrors(etcd))
    else:
        from services.common.metrics import start_metrics

        await start_metrics(running, config.server)
    return running


async def lead(etcd, dispatcher, config: cfg.PlannerConfig, address: str) -> None:
    """Campaign for the planner's leader key; once elected, run the dispatcher with every write fenced
    by the key; when the lease lapses or a write is fenced off, stop acting and campaign again.

    The key holds "<address> pid <pid>": the address this planner serves on (host:port, a wildcard
    host replaced by the machine's name), where the profiler finds the leader (`leader_address`)."""
    from services.common.etcd import Election
    from services.planner.state import LEADER, PlannerState

    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "[::]", "::", ""):
        host = socket.gethostname()
    election = Election(etcd, LEADER, f"{host}:{port} pid {os.getpid()}", config.leader_ttl_s)
    dispatcher.standby_of = election
    try:
        while True:
            revision = await election.campaign()
            dispatcher.state = PlannerState(etcd.fenced(LEADER, revision), dispatcher.meter)
            await dispatcher.start()
            lost = asyncio.ensure_future(election.lost.wait())
            deposed = asyncio.ensure_future(dispatcher.deposed.wait())
            await asyncio.wait({lost, deposed}, return_when=asyncio.FIRST_COMPLETED)
            for t in (lost, deposed):
                t.cancel()
            log.error("leadership_lost", identity=election.identity)
            await dispatcher.stop()
            await election.resign()
    finally:
        await election.resign()


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


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
                        help="absolute path of the folder for the jobs' checkpoints, on storage every node mounts at "
                             "that path; it must be writable, and its parent must exist (default: "
                             "<tmp>/omru-checkpoints, one machine)")
    parser.add_argument("--start-overhead", type=float, default=4.0,
                        help="seconds a job's start or restart is assumed to cost until one is measured (default 4)")
    parser.add_argument("--leader-ttl", type=int, default=15,
                        help="seconds of the leader lease: a standby planner takes over this long after the leader "
                             "dies (default 15)")
    parser.add_argument("--trial-timeout", type=float, default=600.0,
                        help="seconds a profiling trial may run before it is stopped (default 600)")
    parser.add_argument("--checkpoint-retention", type=float, default=7 * 86400.0, metavar="SECONDS",
                        help="seconds an ended job's checkpoint folder is kept after its end, and an earlier batch's "
                             "folder after its last change, before the planner removes it (default 604800: a week)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="job seconds per wall second (only for an emulated cluster; default 1)")
    args = parser.parse_args(argv)
    return cfg.PlannerConfig(
        server=cfg.server_config_from_args(args, env),
        etcd=cfg.etcd_config_from_args(args, env),
        registry=args.registry,
        profiler=args.profiler,
        policy=args.policy,
        checkpoint_root=check_checkpoint_root(args.checkpoint_root),
        start_overhead_s=args.start_overhead,
        time_scale=args.time_scale,
        leader_ttl_s=args.leader_ttl,
        trial_timeout_s=args.trial_timeout,
        checkpoint_retention_s=args.checkpoint_retention,
    )


def check_checkpoint_root(root: str) -> str:
    """root when it is "" (the default) or an absolute path to a folder this process can create files in
    (made when only its last part is missing, as for a run's own work folder); else ConfigError naming it.
    The planner only names checkpoint folders: a root whose parent is missing, or that it cannot write
    to, is on a cluster storage not mounted (or not writable) where the directives point."""
    if not root:
        return root
    what = f"checkpoint root {root!r}"
    if not os.path.isabs(root):
        raise ConfigError(f"{what} is not an absolute path (every node must find it at the same path)")
    if not os.path.isdir(os.path.dirname(root.rstrip("/")) or "/"):
        raise ConfigError(f"{what} does not exist, nor its parent: mount the shared checkpoint storage there")
    try:
        os.mkdir(root)
    except FileExistsError:
        if not os.path.isdir(root):
            raise ConfigError(f"{what} is not a folder") from None
    except OSError:
        pass  # the write below says why
    try:  # a real write: permission bits say nothing for root, nor of a read-only mount
        fd, probe = tempfile.mkstemp(prefix=".omru-write-check-", dir=root)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{what} is not writable by uid {os.geteuid()}: {exc.strerror}") from None
    return root


def main(argv: list[str] | None = None) -> int:
    return run_main("planner", parse_config, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
