"""The running system on emulated clusters: how well it carries a plan out at scale.

    .venv/bin/python bench/emulate.py [--seed S] [--sizes 50,200,1000] [--no-online]
                                      [--policy omru] [--noise CV] [--speed-scale X] [--json-dir DIR]
                                      [--keep DIR]

Runs `omru emulate` (services/emulator: real etcd, registry, planner and
executors; emulated workers) on Pollux x Philly batches of 50 jobs on 16
four-GPU nodes, 200 on 64 and 1,000 on 256 (resize cost 30 s), then on
windows of the Philly and ITP traces with their arrivals (50 jobs on 16
nodes). Speeds: 25, 50 and 100 for the three batches, 20 for the windows
(x --speed-scale), so each run takes minutes. Draw a fresh --seed to
evaluate.

Per row: the offline plan (the policy on the same input in the core, as
`omru simulate` plans it; online rows also the online simulation, which
replans at each arrival), the emulated actual makespan, LB_fluid (job
seconds), actual/offline, pl/off (the actual makespan counted from the
service's first plan, over the offline plan: the emulation scales the jobs'
time, not the planner's, so the first plan's wall seconds weigh `speed` times
more than on a cluster), act/pln (the actual makespan over the service's
first plan, both from the first submission: how faithfully the cluster
carried out the plan it made), asplan (the share of epochs that ran on the
GPUs the first plan gave them), actual/LB, epochs run twice, GPU-seconds with two
owners, the planner's plans (count, p50 and max wall seconds), the reuse gap
(wall seconds from the moment a job could take over GPUs another job
released to its start there, p50 and p99; services/emulator/measure.py),
etcd requests and executor events per wall second, CPU seconds of the
planner, registry, etcd and emulator during the run (from the first
submission on), and the wall time. Figures only: nothing passes or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import workloads  # noqa: E402

from omru.cli.commands.emulate import emulate  # noqa: E402
from services.emulator.cluster import EmulationConfig  # noqa: E402
from services.planner.core import profiles, registry, simulator  # noqa: E402
from services.planner.core.model import Cluster, PlanningInput  # noqa: E402

RESIZE_COST_S = 30.0
BATCHES = {50: (16, 25.0), 200: (64, 50.0), 1000: (256, 100.0)}  # jobs: (nodes, speed)
ONLINE = (50, 16, 20.0)


def header() -> None:
    print(f"{'workload':<22} {'offline':>8} {'actual':>8} {'LB':>8} {'act/off':>7} {'pl/off':>7} {'act/pln':>7} {'asplan':>6} {'act/LB':>7} {'twice':>5} "
          f"{'2owner':>6} {'plans':>5} {'plan50':>6} {'planmx':>6} {'gap50':>6} {'gap99':>6} {'etcd/s':>6} "
          f"{'ev/s':>6} {'plnCPU':>6} {'regCPU':>6} {'etcCPU':>6} {'emuCPU':>6} {'wall':>6}")


def row(name: str, r: dict, note: str = "") -> None:
    c = r["control"]
    print(f"{name:<22} {r['offline_makespan_s']:>8.0f} {r['makespan_s']:>8.0f} {r['lower_bound_s']:>8.0f} "
          f"{r['makespan_s'] / r['offline_makespan_s']:>7.3f} "
          f"{(r['makespan_s'] - r['first_plan_at_s']) / r['offline_makespan_s']:>7.3f} "
          f"{r['makespan_s'] / r['planned_makespan_s']:>7.3f} {r['as_planned']:>6.3f} "
          f"{r['makespan_s'] / r['lower_bound_s']:>7.3f} "
          f"{r['epochs_run_twice']:>5} {r['double_owned']:>6.1f} {c['reconciles']:>5} {c['plan_s_p50']:>6.2f} "
          f"{c['plan_s_max']:>6.2f} {c['reuse_gap_s_p50']:>6.2f} {c['reuse_gap_s_p99']:>6.2f} "
          f"{c['etcd_requests_per_s']:>6.0f} {c['executor_events_per_s']:>6.1f} {c['planner_cpu_s']:>6.0f} "
          f"{c['registry_cpu_s']:>6.0f} {c['etcd_cpu_s']:>6.0f} {c['emulator_cpu_s']:>6.0f} {r['wall_s']:>6.0f}" + (f"  {note}" if note else "")
          + (f"  {r['refusals']} directives refused (requeued)" if r["refusals"] else "")
          + ("" if r["all_finished"] else "  NOT ALL FINISHED"), flush=True)
    worst = ", ".join(f"{w['job_id']} on {w['node_id']} at {w['start_s']:.0f} s: {w['gap_s']:.2f} s"
                      for w in c["worst_hand_overs"] if w["gap_s"] >= 1.0)
    if worst:
        print(f"    longest hand-overs (wall s): {worst}")
    for job_id, why in sorted(r["failures"].items()):
        print(f"    {job_id} failed on {why}")


def run(name: str, jobs, nodes: int, speed: float, args, folder: Path) -> dict:
    file = name.replace(" ", "_").replace("/", "-")
    csv = folder / f"{file}.csv"
    csv.write_text(profiles.to_csv(jobs))
    config = EmulationConfig(profiles=str(csv), nodes=nodes, gpus_per_node=workloads.GPUS_PER_NODE,
                             policy=args.policy, speed=speed, noise=args.noise, resize_cost_s=RESIZE_COST_S,
                             seed=args.seed)
    result = emulate(config, jobs, work_dir=str(Path(args.keep) / file) if args.keep else None)
    if args.json_dir:
        Path(args.json_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.json_dir) / f"{file}.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=int(time.time()) % 1000, help="batch seed (default: a fresh one)")
    ap.add_argument("--sizes", default="50,200,1000", help="batch sizes to run (of 50, 200, 1000)")
    ap.add_argument("--no-online", action="store_true", help="skip the Philly and ITP windows")
    ap.add_argument("--policy", default="omru")
    ap.add_argument("--noise", type=float, default=0.0, help="coefficient of variation of epoch times")
    ap.add_argument("--speed-scale", type=float, default=1.0, help="multiply every row's speed")
    ap.add_argument("--json-dir", help="write each row's full report there")
    ap.add_argument("--keep", metavar="DIR", help="keep each row's logs, etcd data and checkpoints under DIR")
    args = ap.parse_args()
    gone = workloads.missing()
    if gone:
        print(f"../shared/data is missing {len(gone)} file(s) (e.g. {gone[0]}): nothing to emulate")
        return 0
    print(f"policy {args.policy}, seed {args.seed}, noise {args.noise}, resize cost {RESIZE_COST_S:.0f} s; "
          "makespans in job seconds, plan and gap columns in wall seconds")
    header()
    with tempfile.TemporaryDirectory(prefix="omru-bench-emulate-") as tmp:
        for n in (int(x) for x in args.sizes.split(",") if x):
            nodes, speed = BATCHES[n]
            jobs = workloads.pollux_batch(n, nodes, args.seed)
            name = f"pollux {n}j/{nodes}x4 s{args.seed}"
            row(name, run(name, jobs, nodes, speed * args.speed_scale, args, Path(tmp)),
                f"speed {speed * args.speed_scale:g}")
        if not args.no_online:
            n, nodes, speed = ONLINE
            for kind in ("philly", "itp"):
                jobs = workloads.pollux_batch(n, nodes, args.seed, kind=kind, arrivals=True)
                problem = PlanningInput(jobs, Cluster(nodes, workloads.GPUS_PER_NODE), resize_cost_s=RESIZE_COST_S)
                online, replans = simulator.online(registry.get(args.policy), problem, args.policy)
                name = f"{kind} {n}j/{nodes}x4 s{args.seed}"
                row(name, run(name, jobs, nodes, speed * args.speed_scale, args, Path(tmp)),
                    f"speed {speed * args.speed_scale:g}; online simulation {online.makespan_s:.0f} s ({replans} replans)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
