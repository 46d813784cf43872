"""Every policy on every workload: makespan / LB_fluid, utilisation, resizes, planning seconds.

    .venv/bin/python bench/policies.py [--quick] [--ga-generations N] [--seeds S]

Workloads: the paper's data (examples/profiles, both tasks, G = 2, 4, 8);
Pollux-derived batches of 50 jobs on 16 four-GPU nodes, 200 on 64 and 1,000
on 256 (placement-aware, resize cost 30 s); a Gavel-derived batch; and, with
arrivals, windows of the Philly and ITP traces replayed online (each policy
replans at every arrival, may revise what runs from its next epoch boundary,
and never sees a job before it arrives). The
Pollux, Gavel and trace data come from ../shared/data (relative to the repo
root); without it only the paper rows are printed, and the bench says so.

It prints one table (a row per workload and policy), then omru's makespan
over every other policy's on each batch, then the seconds omru takes to plan
1,000 jobs on 1,024 GPUs next to omru-ga's.

Plans that ignore placement or resize cost (the reference policies) are run
through simulator.replay, which charges them what the cluster would; every
plan printed has passed the validator. omru-ga runs its defaults (50 x 1000)
where that takes minutes at most; on the 200- and 1,000-job batches it runs
--ga-generations generations (printed next to it) and the last lines give
its measured seconds per generation and what 1,000 would take.
Figures only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import workloads  # noqa: E402

from services.planner.core import fluid, profiles, registry, simulator, validate  # noqa: E402
from services.planner.core.engine import resizes  # noqa: E402
from services.planner.core.model import Cluster, PlanningInput  # noqa: E402

PAPER = ROOT / "examples" / "profiles"
BATCH_POLICIES = ("omru", "omru-ga", "optimus", "min-total-duration", "fifo", "sjf", "tiresias")
ONLINE_POLICIES = ("omru", "fifo", "sjf", "tiresias")


def measure(name: str, problem: PlanningInput) -> dict:
    start = time.perf_counter()
    plan = registry.plan(name, problem)
    seconds = time.perf_counter() - start
    if validate.violations(plan, problem):
        plan = simulator.replay(plan, problem)
    validate.check(plan, problem)
    return {"makespan_s": plan.makespan_s, "utilization": plan.utilization(problem), "resizes": resizes(plan),
            "plan_s": seconds, "unplaced": len(plan.unplaced)}


RATIOS: dict[str, dict[str, float]] = {}  # workload -> policy -> makespan / LB_fluid


def row(workload: str, name: str, lb: float, m: dict, note: str = "") -> None:
    RATIOS.setdefault(workload, {})[name] = m["makespan_s"] / lb
    print(f"{workload:<32} {name + note:<24} {m['makespan_s'] / lb:>8.3f} {m['utilization'] * 100:>7.1f} "
          f"{m['resizes']:>8} {m['plan_s']:>9.3f}" + (f"  ({m['unplaced']} unplaced)" if m["unplaced"] else ""),
          flush=True)


LEGEND = """\
workloads (T/LBfl: makespan / LB_fluid of the workload's best-placement profile):
  paper <task> G=g      the paper's data (examples/profiles, V100), one node of g GPUs, no resize cost
  pollux <n>j/<G>g s<k>  Pollux-derived batch, 4-GPU nodes, placement-aware, resize cost 30 s;
                        sizes and run times from a Philly window (seed k)
  gavel 50j/32g         Gavel-derived batch (V100 throughputs, no placement data), resize cost 30 s
  <trace> s<k> (r replans)  online: a Philly / ITP window with its arrivals, 50 jobs on 16 x 4 GPUs,
                        resize cost 30 s, replanned at every arrival (LB_fluid ignores arrivals)
plan_s: seconds the policy took to plan (online: all its replans together)"""


def header() -> None:
    print(f"{LEGEND}\n\n{'workload':<32} {'policy':<24} {'T/LBfl':>8} {'util%':>7} {'resizes':>8} {'plan_s':>9}")


def paper_rows() -> None:
    path = next(PAPER.glob("*v100*"))
    for task in ("image", "action"):
        jobs = profiles.load_csv(path, task=task)
        for G in (2, 4, 8):
            problem = PlanningInput(tuple(jobs), Cluster.of(G))
            lb = fluid.solve(problem).T
            for name in ("omru", "omru-ga", "optimus", "parallel", "sequential"):
                row(f"paper {task} G={G}", name, lb, measure(name, problem))


def batch_rows(args) -> dict:
    sizes = [(50, 16), (200, 64), (1000, 256)] if not args.quick else [(50, 16)]
    ga_rate = {}
    for n, nodes in sizes:
        for seed in range(args.seeds):
            jobs = workloads.pollux_batch(n, nodes, seed)
            problem = PlanningInput(jobs, Cluster(nodes, workloads.GPUS_PER_NODE), resize_cost_s=30.0)
            lb = fluid.solve(problem).T
            label = f"pollux {n}j/{nodes * 4}g s{seed}"
            for name in BATCH_POLICIES:
                note = ""
                p = problem
                if name == "omru-ga" and n > 50:
                    p = dataclasses.replace(problem, options={"generations": args.ga_generations})
                    note = f" (gen={args.ga_generations})"
                m = measure(name, p)
                if name == "omru-ga" and n > 50:
                    ga_rate[(n, nodes)] = m["plan_s"] / max(1, args.ga_generations)
                row(label, name, lb, m, note)
    jobs = workloads.gavel_batch(50, 8, 0)
    problem = PlanningInput(jobs, Cluster(8, workloads.GPUS_PER_NODE), resize_cost_s=30.0)
    lb = fluid.solve(problem).T
    for name in BATCH_POLICIES:
        row("gavel 50j/32g", name, lb, measure(name, problem))
    return ga_rate


def comparison() -> None:
    """omru's makespan over each other policy's, per batch workload (below 1: omru ends first),
    then, per batch size, omru's T/LBfl over the seeds and its largest ratio to each policy."""
    print("\nomru's makespan / each other policy's (Pollux and Gavel batches):")
    sizes: dict[str, list[dict[str, float]]] = {}
    for workload, ratios in RATIOS.items():
        if workload.startswith(("pollux", "gavel")) and "omru" in ratios:
            others = "  ".join(f"{name} {ratios['omru'] / r:.3f}" for name, r in ratios.items() if name != "omru")
            print(f"  {workload:<22} {others}")
            sizes.setdefault(workload.rsplit(" s", 1)[0], []).append(ratios)
    print("\nper batch size, over its seeds: omru T/LBfl (max), and the largest omru / other policy:")
    for size, runs in sizes.items():
        ts = [r["omru"] for r in runs]
        worst = "  ".join(f"{name} {max(r['omru'] / r[name] for r in runs):.3f}" for name in runs[0] if name != "omru")
        print(f"  {size:<18} {' '.join(f'{t:.3f}' for t in ts)} (max {max(ts):.3f});  {worst}")


def scale_line(ga_rate: dict) -> None:
    print("\nplanning 1,000 jobs on 1,024 GPUs (256 x 4), Pollux batch seed 0:")
    jobs = workloads.pollux_batch(1000, 256, 0)
    problem = PlanningInput(jobs, Cluster(256, workloads.GPUS_PER_NODE), resize_cost_s=30.0)
    start = time.perf_counter()
    registry.plan("omru", problem)
    print(f"  omru     {time.perf_counter() - start:.2f} s")
    rate = ga_rate.get((1000, 256))
    if rate is None:
        p = dataclasses.replace(problem, options={"generations": 2})
        start = time.perf_counter()
        registry.plan("omru-ga", p)
        rate = (time.perf_counter() - start) / 2
    print(f"  omru-ga  {rate:.2f} s per generation (population 50): {rate * 1000:.0f} s at its default 1,000 generations")


def online_rows(args) -> None:
    for kind in ("philly", "itp"):
        for seed in range(args.seeds):
            jobs = workloads.pollux_batch(50, 16, 100 + seed, kind=kind, arrivals=True)
            problem = PlanningInput(jobs, Cluster(16, workloads.GPUS_PER_NODE), resize_cost_s=30.0)
            lb = fluid.solve(problem).T
            for name in ONLINE_POLICIES:
                start = time.perf_counter()
                plan, replans = simulator.online(registry.get(name), problem, name)
                seconds = time.perf_counter() - start
                validate.check(plan, problem)
                m = {"makespan_s": plan.makespan_s, "utilization": plan.utilization(problem),
                     "resizes": resizes(plan), "plan_s": seconds, "unplaced": len(plan.unplaced)}
                row(f"{kind} s{100 + seed} ({replans} replans)", name, lb, m)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the 50-job batch")
    ap.add_argument("--ga-generations", type=int, default=10, help="omru-ga generations on the big batches")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per batch workload")
    args = ap.parse_args()
    header()
    paper_rows()
    gone = workloads.missing()
    if gone:
        print(f"\n../shared/data is missing {len(gone)} file(s) (e.g. {gone[0]}): Pollux, Gavel and trace rows skipped")
        return 0
    ga_rate = batch_rows(args)
    online_rows(args)
    comparison()
    scale_line(ga_rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
