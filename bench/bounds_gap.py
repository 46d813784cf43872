"""How much of omru's distance to LB_fluid whole epochs and restarts force, on the Pollux batches.

    .venv/bin/python bench/bounds_gap.py [--seeds S] [--time-limit SECONDS]

For each Pollux-derived batch of bench/policies.py (50 jobs on 16 four-GPU
nodes, 200 on 64, 1,000 on 256; resize cost 30 s) it prints LB_fluid, the
whole-epoch bound (bounds.whole_epochs: the fluid LP with every job's epochs
split over GPU counts in whole epochs and one restart per count after the
first; a MILP, its proven bound when the time limit stops it), omru's
makespan over each, and omru's planning seconds. What lies between the two
bounds is forced by whole epochs and restarts; what lies between the
whole-epoch bound and omru is left to scheduling (packing the jobs in time and
onto nodes), or to a bound that is not tight. Needs ../shared/data/pollux.
Figures only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import workloads  # noqa: E402

from services.planner.core import bounds, fluid, registry, validate  # noqa: E402
from services.planner.core.model import Cluster, PlanningInput  # noqa: E402

BATCHES = ((50, 16), (200, 64), (1000, 256))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..S-1 of each batch (default 5)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="MILP seconds per batch (default 60)")
    args = ap.parse_args()
    missing = workloads.missing()
    if missing:
        print("needs ../shared/data: missing " + ", ".join(missing))
        return 1
    print(f"{'batch':<16}{'LB_fluid s':>12}{'whole/fluid':>13}{'omru/fluid':>12}{'omru/whole':>12}"
          f"{'plan s':>8}{'bound s':>9}")
    for n, nodes in BATCHES:
        for seed in range(args.seeds):
            p = PlanningInput(workloads.pollux_batch(n, nodes, seed), Cluster(nodes, 4), resize_cost_s=30.0)
            lb = fluid.solve(p).T
            start = time.perf_counter()
            whole = bounds.whole_epochs(p, args.time_limit)
            bound_s = time.perf_counter() - start
            start = time.perf_counter()
            plan = validate.check(registry.plan("omru", p), p)
            plan_s = time.perf_counter() - start
            print(f"{f'{n}j/{4 * nodes}g s{seed}':<16}{lb:>12.0f}{whole / lb:>13.4f}{plan.makespan_s / lb:>12.4f}"
                  f"{plan.makespan_s / whole:>12.4f}{plan_s:>8.2f}{bound_s:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
