"""`omru emulate`: the real services on an emulated cluster, replaying profiled jobs.

    omru emulate --profiles CSV [--task T] --nodes N --gpus-per-node K --policy P
                 --speed S [--noise CV] [--resize-cost SECONDS] [--seed N]
                 [--json FILE] [--gantt FILE.png]

etcd, the registry, the profiler and the planner run as under `omru up`; N
emulated nodes (real executors whose workers sleep each epoch for the
profile's time / S instead of training) run K GPUs each, 64 nodes to a
process. The jobs (the CSV `omru simulate` takes) are submitted through the
planner's API at arrival_s / S. Times in the report are job seconds (wall x S)
unless named wall: makespan_s, planned_makespan_s (the service's first plan),
first_plan_at_s (when the service stored its first plan: the planning wait,
which the emulation does not scale, so it weighs S times more than on a
cluster; ratios are given from the submission and from the first plan),
as_planned (the share of epochs that ran on the GPUs the first plan gave
them), critical_chain (the jobs whose hand-overs set the makespan, with their
waits and runs beside the first plan's: late hand-overs or slow runs),
offline_makespan_s (the policy on the same input in the core, as `omru
simulate` plans it), lower_bound_s (LB_fluid), epochs_run_twice, double_owned
(GPU-seconds two jobs held one GPU), directives refused (the job waits for the next plan) and failures with
their reasons, and `control`: the planner's plans (count
and wall seconds), reuse gaps (wall seconds from the moment a job could take
over GPUs another job released to its start there; services/emulator/measure.py),
etcd requests and executor events per wall second, and the CPU seconds the
planner, registry, etcd and emulator spent from the first submission to the
last job's end (not their start-up). Exit 1 when a job did not finish.
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "emulate",
        help="run the real services on an emulated cluster of N nodes and measure how they carry a plan out",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--profiles", required=True, metavar="CSV", help="profile CSV, as for omru simulate")
    p.add_argument("--task", help="keep only the rows of this task (needs a 'task' column)")
    p.add_argument("--nodes", required=True, type=int, metavar="N", help="emulated nodes")
    p.add_argument("--gpus-per-node", required=True, type=int, metavar="K", help="GPUs per node")
    p.add_argument("--policy", required=True, metavar="NAME", help="planning policy, e.g. omru, omru-ga")
    p.add_argument("--speed", required=True, type=float, metavar="S", help="job seconds per wall second")
    p.add_argument("--noise", type=float, default=0.0, metavar="CV",
                   help="coefficient of variation of each epoch's time (lognormal, seeded; default 0)")
    p.add_argument("--resize-cost", type=float, default=0.0, metavar="SECONDS",
                   help="job seconds each restart from a checkpoint costs (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the noise and of randomised policies (default 0)")
    p.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                   help="wall seconds the jobs may take before the run gives up (default 3600)")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE ('-' = stdout, no table)")
    p.add_argument("--gantt", metavar="FILE.png", help="write the planned and actual Gantt chart")
    p.add_argument("--work-dir", metavar="DIR", help="keep the services' logs, etcd data and checkpoints there")
    p.set_defaults(func=run)


def emulate(config, jobs, gantt: str | None = None, kill_process_at: float | None = None,
            work_dir: str | None = None) -> dict:
    """Plan offline, run the emulation, measure; the report object."""
    import asyncio

    from omru.cli.commands.simulate import simulate
    from services.emulator import measure
    from services.emulator.cluster import EmulatedCluster, drive
    from services.executor.servicer import is_refusal

    offline = simulate(jobs, config.gpus, config.gpus_per_node, config.policy, config.seed, config.resize_cost_s)
    lower_bound = offline["lower_bounds"]["fluid_s"]
    from pathlib import Path

    where = {"work_dir": Path(work_dir), "keep": True} if work_dir else {}
    with EmulatedCluster(config, **where) as cluster:
        run = asyncio.run(drive(cluster, jobs, kill_process_at=kill_process_at))
        plan_seconds = cluster.planner_plan_seconds()
    events, wall = run["events"], run["wall_s"]
    figures, holds, planned = measure.figures(events, run["origin"], config.speed, config.gpus, [j.id for j in jobs],
                                              run["first_plan"], config.policy, lower_bound)
    result = {
        **figures,
        "nodes": config.nodes, "gpus_per_node": config.gpus_per_node, "speed": config.speed, "noise": config.noise,
        "resize_cost_s": config.resize_cost_s, "seed": config.seed,
        "offline_makespan_s": offline["makespan_s"],
        "epochs_run_twice": measure.epochs_run_twice(events),
        "double_owned": measure.double_owned_gpu_s(holds),
        "states": {r.job_id: r.state for r in run["records"]},
        "failures": {e.job_id: f"{e.node_id}: {e.message}" for e in events
                     if e.kind == "failed" and not is_refusal(e.message)},
        "refusals": sum(1 for e in events if e.kind == "failed" and is_refusal(e.message)),
        "killed_nodes": run["killed_nodes"],
        "wall_s": wall,
        "control": measure.control(events, holds, config.speed, wall, plan_seconds, run["etcd_requests"], run["cpu_s"]),
    }
    if gantt:
        from services.planner import report

        report.gantt(gantt, holds, 0.0, planned, title=f"{config.policy}: {len(jobs)} jobs on {config.nodes} x "
                     f"{config.gpus_per_node} emulated GPUs (job seconds)")
    return result


def run(args: argparse.Namespace) -> int:
    import json

    from omru.cli.main import CliError
    from services.emulator.cluster import EmulationConfig
    from services.planner.core import profiles
    from services.planner.core.model import PlanningError

    try:
        config = EmulationConfig(profiles=args.profiles, task=args.task, nodes=args.nodes,
                                 gpus_per_node=args.gpus_per_node, policy=args.policy, speed=args.speed,
                                 noise=args.noise, resize_cost_s=args.resize_cost, seed=args.seed,
                                 timeout_s=args.timeout)
        jobs = profiles.load_csv(args.profiles, task=args.task)
        result = emulate(config, jobs, gantt=args.gantt, work_dir=args.work_dir)  # the offline plan refuses what omru simulate refuses
    except (ValueError, PlanningError) as exc:
        raise CliError(str(exc)) from None
    if args.json and args.json != "-":
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.json == "-":
        print(json.dumps(result))
    else:
        print(format_report(result))
    return 0 if result["all_finished"] else 1


def format_report(r: dict) -> str:
    c, chain = r["control"], r["critical_chain"]
    lb = r["lower_bound_s"]
    ratio = lambda a, b: f"{a / b:.3f}" if b > 0 else "-"  # noqa: E731
    done = sum(1 for j in r["jobs"] if j["finished"])
    return "\n".join([
        f"emulated {r['nodes']} nodes x {r['gpus_per_node']} GPUs at speed {r['speed']:g} (noise {r['noise']:g}, "
        f"resize cost {r['resize_cost_s']:g} s), policy {r['policy']}: {done}/{len(r['jobs'])} jobs finished "
        f"in {r['wall_s']:.0f} wall s",
        f"makespan      actual {r['makespan_s']:.0f} s  service's first plan {r['planned_makespan_s']:.0f} s  "
        f"offline plan {r['offline_makespan_s']:.0f} s  LB_fluid {lb:.0f} s (job seconds)",
        f"ratios        actual/offline {ratio(r['makespan_s'], r['offline_makespan_s'])}  "
        f"(from the first plan {ratio(r['makespan_s'] - r['first_plan_at_s'], r['offline_makespan_s'])}, "
        f"{r['first_plan_at_s']:.0f} s after the submission)  actual/first plan "
        f"{ratio(r['makespan_s'], r['planned_makespan_s'])}  actual/LB {ratio(r['makespan_s'], lb)}  "
        f"utilisation {r['utilisation'] * 100:.1f} %  resizes {len(r['resizes'])}  "
        f"epochs on the GPUs the first plan gave them {r['as_planned'] * 100:.1f} %",
        f"critical chain {len(chain['links'])} jobs up to the last end: waits {chain['wait_s']:.0f} s "
        f"(planned {chain['planned_wait_s']:.0f} s), runs {chain['run_s']:.0f} s (planned {chain['planned_run_s']:.0f} s)",
        f"correctness   epochs run twice {r['epochs_run_twice']}  double-owned GPU-seconds {r['double_owned']:.1f}  "
        f"directives refused {r['refusals']}  jobs failed {len(r['failures'])}",
        f"control       {c['reconciles']} plans (p50 {c['plan_s_p50']:.2f} s, p99 {c['plan_s_p99']:.2f} s, "
        f"max {c['plan_s_max']:.2f} s)  reuse gap p50 {c['reuse_gap_s_p50']:.2f} s p99 {c['reuse_gap_s_p99']:.2f} s "
        f"over {c['hand_overs']} hand-overs (wall)",
        f"load          etcd {c['etcd_requests_per_s']:.0f} req/s  executor events {c['executor_events_per_s']:.1f}/s  "
        f"CPU: planner {c['planner_cpu_s']:.0f} s, registry {c['registry_cpu_s']:.0f} s, etcd {c['etcd_cpu_s']:.0f} s, emulator {c['emulator_cpu_s']:.0f} s",
    ])
