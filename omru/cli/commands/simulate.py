"""`omru simulate`: plan a batch offline from a profile CSV, print the plan and how good it is.

    omru simulate --profiles CSV [--task TASK] --gpus G [--gpus-per-node K]
                  --policy NAME [--option KEY=VALUE ...] [--seed S]
                  [--resize-cost SECONDS] [--json]

The CSV has one row per job and GPU count measured:
`job,epochs,gpus,epoch_seconds`, optionally `task` (rows of other tasks are
dropped with --task), `nodes` (the row's time for its GPUs spread over that
many nodes), `arrival_s` and `requested_gpus` (see
services/planner/core/profiles.py). A job needs rows only at the counts
measured: its largest is the most GPUs it gets, whatever G is, and a count
between takes the time of the nearest measured count below it (one below the
smallest measured scales it ideally; see services/planner/core/model.py).
--option (repeatable) passes an option to the policy, e.g. population=20 and
generations=200 to omru-ga; a value is an integer, else a finite number,
else a string; a key the policy does not read is refused, naming the ones it
does. --resize-cost charges every change of a running job's GPU set
(checkpoint + restart); a plan is run as the cluster would run it (placement
times and resize costs charged, nothing starting before its job arrives)
before it is measured. `--json` prints one object: policy, gpus, jobs (how
many), makespan_s, utilization (honest: busy GPU-seconds / (G * makespan)),
reference_utilization (the reference code's formula, its quirk included),
lower_bounds {length_s, area_s, fluid_s, static_s}, plan_seconds (wall time
of planning), segments.
"""

from __future__ import annotations

import argparse
import math
from typing import Mapping


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="plan a batch of profiled jobs offline and report makespan, utilisation, lower bounds",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--profiles", required=True, metavar="CSV",
                   help="job,epochs,gpus,epoch_seconds[,task] rows at the GPU counts measured")
    p.add_argument("--task", help="keep only the rows of this task (needs a 'task' column)")
    p.add_argument("--gpus", required=True, type=int, metavar="G", help="GPUs in the cluster")
    p.add_argument("--gpus-per-node", type=int, metavar="K", help="GPUs per node (default: all on one node)")
    p.add_argument("--policy", required=True, metavar="NAME", help="planning policy, e.g. omru-ga, sequential")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the policy, repeatable (e.g. omru-ga: population=20, generations=200; "
                        "an unknown key is refused, naming the policy's options)")
    p.add_argument("--seed", type=int, default=0, help="seed of randomised policies (default 0)")
    p.add_argument("--resize-cost", type=float, default=0.0, metavar="SECONDS",
                   help="seconds each change of a running job's GPU set costs (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def simulate(jobs, gpus: int, gpus_per_node: int | None, policy: str, seed: int, resize_cost_s: float = 0.0,
             options: Mapping[str, object] | None = None) -> dict:
    """Plan, validate and measure; the --json object. Raises PlanningError on bad input (an option
    the policy does not read among them)."""
    import dataclasses
    import time

    from services.planner.core import bounds, registry, validate
    from services.planner.core.model import Cluster, PlanningError, PlanningInput

    from services.planner.core.simulator import replay

    options = dict(options or {})
    known = registry.options(policy)
    for key in sorted(options):
        if key not in known:
            hint = " (the seed is --seed)" if key == "seed" else ""
            raise PlanningError(f"policy {policy!r} has no option {key!r}{hint}; its options: "
                                f"{', '.join(known) or 'none'}")
    problem = PlanningInput(tuple(jobs), Cluster.of(gpus, gpus_per_node), seed=seed, options=options,
                            resize_cost_s=resize_cost_s)
    planner = registry.get(policy)
    start = time.perf_counter()
    plan = planner(problem)
    if validate.violations(plan, problem):  # ignored placement / resize cost / arrivals: charge them
        plan = dataclasses.replace(replay(plan, problem), reference_utilization=None)
    plan_seconds = time.perf_counter() - start
    validate.check(plan, problem)
    utilization = plan.utilization(problem)
    reference = plan.reference_utilization
    return {
        "policy": policy,
        "gpus": problem.cluster.gpus,
        "jobs": len(problem.jobs),
        "makespan_s": plan.makespan_s,
        "utilization": utilization,
        "reference_utilization": utilization if reference is None else reference,
        "lower_bounds": bounds.all_bounds(problem).to_dict(),
        "plan_seconds": plan_seconds,
        "segments": [s.to_dict() for s in sorted(plan.segments, key=lambda s: (s.start_s, s.gpus))],
    }


def run(args: argparse.Namespace) -> int:
    import json

    from omru.cli.main import CliError
    from services.planner.core import profiles
    from services.planner.core.model import PlanningError

    try:
        options = parse_options(args.option)
        jobs = profiles.load_csv(args.profiles, task=args.task)
        result = simulate(jobs, args.gpus, args.gpus_per_node, args.policy, args.seed, args.resize_cost, options)
    except PlanningError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(result))
    else:
        print(format_report(result))
    return 0


def parse_options(pairs: list[str]) -> dict[str, object]:
    """`--option KEY=VALUE` arguments as a dict: each value an integer, else a finite number, else the
    string. Raises PlanningError on an argument that is not KEY=VALUE or a key given twice."""
    from services.planner.core.model import PlanningError

    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise PlanningError(f"--option {pair!r} is not KEY=VALUE")
        if key in out:
            raise PlanningError(f"--option {key} given twice")
        out[key] = _value(raw)
    return out


def _value(raw: str) -> object:
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        value = float(raw)
    except ValueError:
        return raw
    return value if math.isfinite(value) else raw


def format_report(result: dict) -> str:
    lines = [f"{'job':<16} {'start_min':>10} {'end_min':>10} {'epochs':>7}  gpus"]
    for s in result["segments"]:
        lines.append(
            f"{s['job']:<16} {s['start_s'] / 60:>10.1f} {s['end_s'] / 60:>10.1f} {s['epochs']:>7}  "
            f"{','.join(map(str, s['gpus']))}"
        )
    lb = result["lower_bounds"]
    lines += [
        "",
        f"policy {result['policy']}: {result['jobs']} jobs on {result['gpus']} GPUs, "
        f"planned in {result['plan_seconds']:.3f} s",
        f"makespan      {result['makespan_s']:.1f} s ({result['makespan_s'] / 60:.1f} min)",
        f"utilisation   {result['utilization'] * 100:.3f} % "
        f"(reference formula: {result['reference_utilization'] * 100:.3f} %)",
        "lower bounds  "
        + "  ".join(f"{k[:-2]} {lb[k] / 60:.1f} min" for k in ("length_s", "area_s", "fluid_s", "static_s")),
        f"gap to fluid  {(result['makespan_s'] / lb['fluid_s'] - 1) * 100:.1f} %",
    ]
    return "\n".join(lines)
