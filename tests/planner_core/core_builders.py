"""Builders for planner-core tests: jobs, problems, random instances, the example data."""

from __future__ import annotations

import csv
import dataclasses
import random
from pathlib import Path

from services.planner.core import profiles, registry
from services.planner.core.model import Cluster, Job, PlanningInput

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "profiles"
PROFILES_CSV = EXAMPLES / "v100_epoch_times.csv"
REFERENCE_CSV = EXAMPLES / "reference_results.csv"

ALL_POLICIES = ("sequential", "parallel", "optimus", "omru-noreuse", "omru-ga")
# The core's own policies (test modules of the planner service register some of their own).
CORE_POLICIES = tuple(n for n in registry.names() if registry.get(n).__module__.startswith("services.planner.core"))
# Policies that never change a running job's GPU count (LB_static applies).
STATIC_POLICIES = ("sequential", "parallel", "optimus", "omru-noreuse")


def job(id: str, epochs: int, *times: float) -> Job:
    """A job whose epoch time on g GPUs is times[g - 1]."""
    return Job(id, epochs, {g: t for g, t in enumerate(times, start=1)})


def problem(jobs, gpus: int, gpus_per_node: int | None = None, seed: int = 0, **options) -> PlanningInput:
    return PlanningInput(tuple(jobs), Cluster.of(gpus, gpus_per_node), seed=seed, options=options)


def example_problem(task: str, gpus: int, **kw) -> PlanningInput:
    return problem(profiles.load_csv(PROFILES_CSV, task=task), gpus, **kw)


def reference_rows() -> list[dict]:
    with REFERENCE_CSV.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def random_jobs(rng: random.Random, n: int, gpus: int, monotone: bool) -> list[Job]:
    """n jobs with epoch times on 1..gpus GPUs: monotone (more GPUs never slower,
    sublinear speed-up) or not (random bumps, some counts slower than fewer)."""
    jobs = []
    for i in range(n):
        t1 = rng.uniform(5.0, 500.0)
        alpha = rng.uniform(0.3, 1.0)  # speed-up exponent
        times, prev = [], t1
        for g in range(1, gpus + 1):
            t = t1 / g**alpha
            if monotone:
                t = min(t, prev)
            else:
                t *= rng.uniform(0.7, 1.6)
            times.append(t)
            prev = t
        jobs.append(job(f"job{i}", rng.randint(1, 300), *times))
    return jobs


def random_shape(seed: int) -> tuple[int, int, int, bool]:
    """(jobs 1..20, GPUs 1..64, GPUs per node dividing them, monotone?) from a seed."""
    rng = random.Random(seed)
    n = rng.randint(1, 20)
    gpus = rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, rng.randint(1, 64)])
    per_node = rng.choice([k for k in (1, 2, 3, 4, 8, gpus) if gpus % k == 0])
    return n, gpus, per_node, bool(seed % 2)


def rich_instance(seed: int) -> PlanningInput:
    """Random jobs with spread-placement slow-downs, requested GPUs, arrivals and a resize cost."""
    rng = random.Random(seed)
    per_node = rng.choice([1, 2, 4])
    nodes = rng.randint(1, 4)
    G = per_node * nodes
    jobs = []
    for j in random_jobs(rng, rng.randint(1, 12), G, monotone=bool(seed % 2)):
        spread = {(g, k): j.profile[g] * rng.uniform(1.0, 1.8)
                  for g in range(2, G + 1) for k in range(-(-g // per_node) + 1, min(g, nodes) + 1)}
        jobs.append(dataclasses.replace(j, epochs=rng.randint(1, 40), placement=spread,
                                        arrival_s=rng.choice([0.0, 0.0, rng.uniform(0, 2000)]),
                                        requested_gpus=rng.randint(1, G)))
    return PlanningInput(tuple(jobs), Cluster(nodes, per_node), seed=seed,
                         resize_cost_s=rng.choice([0.0, 5.0, 30.0]))


def multi_node_instance(seed: int) -> PlanningInput:
    """2-6 nodes of 4 GPUs, 5-40 jobs, spread placements up to 2.5x slower, resize cost."""
    rng = random.Random(seed)
    nodes, K = rng.randint(2, 6), 4
    G = nodes * K
    jobs = []
    for i, j in enumerate(random_jobs(rng, rng.randint(5, 40), G, monotone=True)):
        spread = {(g, k): j.profile[g] * rng.uniform(1.0, 2.5)
                  for g in range(2, G + 1) for k in range(-(-g // K) + 1, min(g, nodes) + 1)}
        jobs.append(Job(j.id, rng.randint(1, 60), j.profile, placement=spread))
    return PlanningInput(tuple(jobs), Cluster(nodes, K), resize_cost_s=rng.choice([0.0, 30.0]))
