"""Reproduce the OMRU paper's results side by side: ours, the reference, LB_fluid.

    .venv/bin/python bench/reproduce_paper.py [--population 50] [--generations 1000] [--seed 0] [--seeds 1]

Reads the shared data set ../shared/data/omru/ (relative to the repo root);
when that folder is missing it says so and uses the project's own copy in
examples/profiles/. For every task, G in 2, 4, 8 and policy it prints our
makespan (minutes) and reference-formula utilisation next to the reference
code's, LB_fluid, the gap to it, and the planning seconds (the GA's cost).
With --seeds N > 1 the GA rows also list the makespans of seeds 0..N-1.
Figures only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.planner.core import bounds, profiles, registry, validate  # noqa: E402
from services.planner.core.model import Cluster, PlanningInput  # noqa: E402

SHARED = ROOT.parent / "shared" / "data" / "omru"
OWN = ROOT / "examples" / "profiles"
POLICIES = ("sequential", "parallel", "optimus", "omru-noreuse", "omru-ga")


def data_dir() -> Path:
    if (SHARED / "v100_epoch_times.csv").exists() and (SHARED / "reference_results.csv").exists():
        print("data: ../shared/data/omru (shared data set)")
        return SHARED
    print("data: ../shared/data/omru is missing; using the project's copy in examples/profiles/")
    return OWN


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--population", type=int, default=50)
    ap.add_argument("--generations", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1, help="also run GA seeds 0..N-1 and list their makespans")
    args = ap.parse_args()

    folder = data_dir()
    with (folder / "reference_results.csv").open() as f:
        reference = {
            (r["task"], int(r["gpus"]), r["algorithm"]): r
            for r in csv.DictReader(line for line in f if not line.startswith("#"))
        }
    options = {"population": args.population, "generations": args.generations}
    print(f"GA: population {args.population}, generations {args.generations}, seed {args.seed}\n")
    header = (
        f"{'task':<7}{'G':>3} {'policy':<13}{'ours_min':>9}{'ref_min':>8}{'ours_U%':>9}{'ref_U%':>8}"
        f"{'honest_U%':>10}{'LBfluid':>9}{'gap%':>7}{'plan_s':>8}  match"
    )
    print(header)
    print("-" * len(header))
    matched = total = 0
    ga_times = []
    for task in ("image", "action"):
        jobs = profiles.load_csv(folder / "v100_epoch_times.csv", task=task)
        for G in (2, 4, 8):
            base = PlanningInput(tuple(jobs), Cluster.of(G), seed=args.seed, options=options)
            fluid = bounds.fluid(base)
            for name in POLICIES:
                start = time.perf_counter()
                plan = registry.plan(name, base)
                seconds = time.perf_counter() - start
                validate.check(plan, base)
                if name.startswith("omru"):
                    ga_times.append(seconds)
                ours = plan.makespan_s / 60
                ref = reference.get((task, G, name))
                ok = ref is not None and round(ours) == int(ref["makespan_min"]) and abs(
                    plan.reference_utilization * 100 - float(ref["utilization_pct"])
                ) <= 0.01
                matched += ok
                total += 1
                line = (
                    f"{task:<7}{G:>3} {name:<13}{ours:>9.1f}{ref['makespan_min'] if ref else '-':>8}"
                    f"{plan.reference_utilization * 100:>9.3f}{ref['utilization_pct'] if ref else '-':>8}"
                    f"{plan.utilization(base) * 100:>10.3f}{fluid / 60:>9.1f}"
                    f"{(plan.makespan_s / fluid - 1) * 100:>7.1f}{seconds:>8.2f}  {'yes' if ok else 'NO'}"
                )
                if name.startswith("omru") and args.seeds > 1:
                    spread = []
                    for s in range(args.seeds):
                        p = PlanningInput(tuple(jobs), Cluster.of(G), seed=s, options=options)
                        spread.append(round(registry.plan(name, p).makespan_s / 60))
                    line += f"  seeds 0..{args.seeds - 1}: {spread}"
                print(line)
    print(f"\nrows matching the reference (round(makespan/60), U within 0.01 pct-points): {matched}/{total}")
    print(
        f"GA planning time per plan (6 or 5 jobs, defaults unless overridden): "
        f"min {min(ga_times):.2f} s, max {max(ga_times):.2f} s, mean {sum(ga_times) / len(ga_times):.2f} s"
    )


if __name__ == "__main__":
    main()
